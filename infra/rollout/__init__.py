"""Safe model rollouts: `torchfleet rollout STACK --model REF` and its controls.

- ref.py: the immutable model reference (a file or bucket key + its sha256), checked before
  anything moves, and the stack's store of verified models;
- policy.py: pure decisions: the strategies' steps, HAProxy weights for a traffic share, the
  guards (validated settings with defaults) and their verdict on one evaluation window;
- signals.py: per-model-version request, error and p99 figures of one window, read from the
  stack's Prometheus or, where there is none, from the nodes' own /metrics;
- state.py: the stack's rollout record (stable, candidate, status, step, timeline, control);
- engine.py: the loop that moves traffic step by step, judges each window and rolls back;
- local.py: the local fleet's side of it (HAProxy weights, a node's model file and reload);
- cloud.py, tracks.py, refresh.py: a cloud stack's side (the split through its `rollout` block,
  each track's file, the promotion reaching the stable nodes), and clouds.py: what differs by
  cloud, one table per cloud (a group stack's weight step: infra/deploy/split.py);
- errors.py: `RolloutError`, the base of every part's error, which the command catches once.
"""
