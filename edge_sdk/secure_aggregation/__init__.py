"""Device side of secure aggregation: the pure per-round masking state machine."""

from ursa.edge_sdk.secure_aggregation.participant import (
    KeyAdvert,
    MaskingParticipant,
    ParticipantStage,
    PeerAdvert,
    SecAggError,
    UnmaskShare,
    advert_transcript,
)

__all__ = [
    "KeyAdvert",
    "MaskingParticipant",
    "ParticipantStage",
    "PeerAdvert",
    "SecAggError",
    "UnmaskShare",
    "advert_transcript",
]
