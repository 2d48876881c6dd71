"""The load generator the stages use (payloads built from /v1/model, closed-loop levels).

One import, in one place: the code lives in the runtime package today and moves to
infra/loadgen.py (client-side tools do not belong on every node); when it does, this line is the
only one that changes."""

from torchfleet_runtime import bench as loadgen

__all__ = ["loadgen"]
