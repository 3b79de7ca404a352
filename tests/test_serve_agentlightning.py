"""Agent Lightning's own tracer records the gateway's exact tokens (skips without it).

Agent Lightning's AgentOps tracer reads ``prompt_token_ids`` and
``choices[0].token_ids`` from a chat completion (the fields vLLM fills with
``return_token_ids``) into the span attributes its trainers use. An OpenAI
client call to the gateway, traced by the real tracer, must leave spans with
exactly the ids the gateway recorded. Runs in the ``.venv-agl`` environment of
``make test-integrations``.
"""

from __future__ import annotations

import os

import openai
import pytest

from serve_scripted import ScriptedPolicy, calculator_reply
from turnrl.policy import build_tiny_policy
from turnrl.serve import Gateway, GatewayServer

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch on import
tracer_module = pytest.importorskip(
    "agentlightning.tracer", reason="agentlightning is not installed (.venv-agl has it)"
)


def test_agent_lightnings_tracer_reads_the_exact_tokens() -> None:
    tracer = tracer_module.AgentOpsTracer()
    tracer.init()
    tracer.init_worker(0)
    try:
        policy = ScriptedPolicy(build_tiny_policy(seed=0), calculator_reply)
        with Gateway(policy) as gateway, GatewayServer(gateway) as server:
            client = openai.OpenAI(base_url=server.base_url("agl-trace"), api_key=server.api_key)
            messages = [{"role": "user", "content": "Compute 2*3."}]
            tracer.trace_run(lambda: client.chat.completions.create(model="m", messages=messages))
            (record,) = gateway.views.rollout("agl-trace")["records"]
        spans = [s for s in tracer.get_last_trace() if "prompt_token_ids" in s.attributes]
    finally:
        tracer.teardown_worker(0)
        tracer.teardown()
    (span,) = spans
    assert list(span.attributes["prompt_token_ids"]) == record["prompt_ids"]
    assert list(span.attributes["response_token_ids"]) == record["response_ids"]
