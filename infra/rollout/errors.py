"""The one error a rollout shows its user: `RolloutError`.

Every part of a rollout raises its own kind (ref.RefError, refresh.RefreshError,
signals.SignalError, tracks.VolumeError, local.SwitchError, policy.RolloutSettingsError, and
this one from the engine), each derived from `RolloutError`, so the command catches them in one
place (command.run) and prints the message as it is: the message is the whole of what the user
sees, so each says why and what was left."""

from __future__ import annotations


class RolloutError(RuntimeError):
    """A rollout that cannot start or go on (the message says why and what was left)."""
