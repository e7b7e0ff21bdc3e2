"""Choosing the Tinker protocol version and finding the parameters a server ignores, from what the server publishes.

The servers are the loopback Tinker stand-in (tinker_loopback.py: the real Tinker service is a paid remote service
this machine cannot reach) speaking the current protocol and the older subset SkyRL's server speaks, each publishing
its OpenAPI document over real HTTP on loopback.
"""

from __future__ import annotations

import pytest

from rlctl.trainer.backends.tinker_protocol import (
    FINISH_SESSION_ROUTE,
    SentParameter,
    ServerDescription,
    choose_protocol,
    describe_server,
    ignored_parameters,
)
from tests.support.live import free_port
from tests.trainer.tinker_loopback import LoopbackServer, LoopbackTinker


@pytest.fixture(scope="module")
def servers():
    """{protocol: ServerDescription} of the stand-in speaking each protocol."""
    described = {}
    for protocol in ("current", "legacy"):
        with LoopbackServer(LoopbackTinker(vocab_size=16, protocol=protocol), free_port()) as server:
            described[protocol] = describe_server(server.url)
    return described


SENT = [
    SentParameter("/api/v1/create_model", ("lora_config",), "rank", 8),
    SentParameter("/api/v1/create_model", ("lora_config",), "train_unembed", True),
    SentParameter("/api/v1/optim_step", ("adam_params",), "beta2", 0.95),
    SentParameter("/api/v1/optim_step", ("adam_params",), "grad_clip_norm", 0.0),
    SentParameter("/api/v1/asample", (), "topk_sample_logprobs", 2),
    SentParameter("/api/v1/asample", ("sampling_params",), "top_p", 0.9),
    SentParameter("/api/v1/forward_backward", (), "loss_fn", "importance_sampling"),  # protobuf: no JSON schema
]


def test_auto_detects_each_protocol_from_the_published_routes(servers: dict[str, ServerDescription]) -> None:
    assert choose_protocol("auto", servers["current"])[0] == "current"
    protocol, reason = choose_protocol("auto", servers["legacy"])
    assert protocol == "legacy" and FINISH_SESSION_ROUTE in reason


def test_configuration_overrides_detection(servers: dict[str, ServerDescription]) -> None:
    assert choose_protocol("current", servers["legacy"]) == ("current", "set by tinker.protocol")
    assert choose_protocol("legacy", servers["current"])[0] == "legacy"
    with pytest.raises(ValueError, match="tinker.protocol"):
        choose_protocol("0.25", servers["current"])


def test_a_server_without_an_openapi_document_is_taken_for_the_current_protocol() -> None:
    assert describe_server(None) == ServerDescription()  # the hosted service: nothing is asked
    assert choose_protocol("auto", describe_server(f"http://127.0.0.1:{free_port()}"))[0] == "current"  # no server


def test_parameters_the_legacy_schemas_do_not_declare_are_found(servers: dict[str, ServerDescription]) -> None:
    ignored = {parameter.label for parameter in ignored_parameters(servers["legacy"], SENT)}
    assert ignored == {"lora_config.train_unembed", "adam_params.grad_clip_norm", "topk_sample_logprobs"}
    assert servers["legacy"].declared_fields("/api/v1/asample", ("sampling_params",)) >= {"top_p", "max_tokens"}
    assert servers["legacy"].declared_fields("/api/v1/forward_backward", ()) is None


def test_a_server_that_declares_no_schemas_gets_no_warnings(servers: dict[str, ServerDescription]) -> None:
    assert ignored_parameters(servers["current"], SENT) == []
    assert ignored_parameters(ServerDescription(), SENT) == []
