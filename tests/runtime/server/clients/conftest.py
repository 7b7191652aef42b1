"""One tiny random-weight server for every client library's module: the libraries' requests and the
shapes they read back are under test, not what the model says (the real-model module asserts that)."""
import pytest

from structured.limits import GrammarLimits
from tests.server_utils import TINY_MODEL, LiveServer, live_server
from tests.tiny_engine import tiny_engine

CITIES = ["Paris", "Oslo"]  # tool arguments a random model can only fill one way: an enum


@pytest.fixture(scope="package")
def server() -> LiveServer:
    # compile workers run SCHED_IDLE: on a busy machine a schema may wait past the default 10 s
    with live_server(tiny_engine(num_blocks=512), grammar=GrammarLimits(compile_seconds=60)) as srv:
        yield srv


@pytest.fixture(scope="package")
def base_url(server: LiveServer) -> str:
    return server.url + "/v1"


@pytest.fixture(scope="package")
def model() -> str:
    return TINY_MODEL
