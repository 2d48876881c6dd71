"""Leave the load balancer, then drain: no client request is sent to a node that is going away.

A spot notice (AWS: 2 minutes, Alibaba: about 5) or a planned drain (the group's terminating
lifecycle action: scale-in, an instance refresh) takes the node out of its load balancer FIRST,
with the node's own credentials, and only then stops the runtime (SIGTERM: the drain finishes
what is in flight). The other order, the runtime draining while the balancer still sends it
work, answers those clients 503 until the balancer's health check has failed twice.

Why here and not in the runtime: the agent has the cloud's SDKs and the instance's credentials,
the runtime stays free of both (it watches the metadata itself only on nodes without an agent,
and turns that off where the agent leaves first: inventory.py's node vars). `Balancer` is what
a cloud (aws.py: the ALB's target group; alicloud.py: the CLB's backend weight) or the local
fleet (infra/deploy/balancer.py: HAProxy's runtime API) implements; a node behind none leaves
nothing. A failed leave is logged and the drain goes ahead: the node is going either way.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from . import boot

# After leaving: how long the balancer may take to stop routing to this node before the drain
# begins (ALB and CLB apply a deregistration within seconds; HAProxy at once).
SETTLE_S = {"aws": 10.0, "alicloud": 10.0, "local": 0.5}


class Balancer(Protocol):
    def describe(self) -> str: ...

    def leave(self) -> None: ...


def leave_then_drain(
    balancer: Balancer | None, drain: Callable[[], object], settle_s: float, why: str
) -> bool:
    """Leave (when behind a balancer), wait `settle_s`, drain. True when the leave succeeded."""
    left = balancer is None
    if balancer is not None:
        try:
            balancer.leave()
            left = True
            boot.log(f"{why}: left {balancer.describe()}; draining in {settle_s:g} s")
        except Exception as err:  # the node is going anyway: drain, and say what failed
            boot.log(f"{why}: could not leave {balancer.describe()} ({err}); draining now")
        if left:
            time.sleep(settle_s)
    boot.log(f"{why}: draining the runtime")
    drain()
    return left


def watch_notice(
    poll: Callable[[], str | None],
    on_notice: Callable[[str], None],
    interval_s: float,
    stop: threading.Event,
) -> str | None:
    """Poll for a spot notice every `interval_s` until one comes (then `on_notice(notice)` and
    return it) or `stop` is set (None). A failed poll is retried; the metadata service is local."""
    failures = 0
    while not stop.is_set():
        try:
            notice = poll()
            failures = 0
        except OSError as err:
            failures += 1
            if failures in (1, 10) or failures % 100 == 0:
                boot.log(f"spot notice poll failed ({failures} in a row): {err}")
            notice = None
        if notice:
            on_notice(notice)
            return notice
        stop.wait(interval_s)
    return None
