"""The built-in mock OpenAI-compatible server: a deterministic stand-in for a GPU engine."""

from calibrate.mock.admission import Admission
from calibrate.mock.answer import Generation
from calibrate.mock.http import BackgroundServer, MockHTTPServer
from calibrate.mock.metrics import Snapshot
from calibrate.mock.model import MockModel
from calibrate.mock.settings import MockSettings

__all__ = [
    "Admission",
    "BackgroundServer",
    "Generation",
    "MockHTTPServer",
    "MockModel",
    "MockSettings",
    "Snapshot",
]
