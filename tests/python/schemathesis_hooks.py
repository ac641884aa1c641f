"""Schemathesis hooks for tests/e2e_schemathesis.rs (loaded with SCHEMATHESIS_HOOKS).

`positive_data_acceptance_within_limits` is schemathesis's own `positive_data_acceptance`
check with one refinement: a 400 for a schema-valid request passes only when the server says
the request broke a limit that no static schema can state, because it depends on

  * the model (the vocabulary size, the context length, how many tokens a text makes, whether
    its tokenizer has byte pieces for structured output: the built-in model's has none),
  * what a string means (a regex, a grammar or a schema given as text that does not compile),
  * the cluster (which ranks are live, which rids are in flight), or
  * another field (best_of equal to n, prompts x n at most 128, a rid with its -<i> suffix).

Each such refusal is listed below by the message the server writes for it (tokenizer-actor's
validate.rs, openai/params.rs and embeddings.rs). Any other 400 for valid data still fails.
The test runs with the built-in check replaced by this one (`--exclude-checks
positive_data_acceptance`); every other check runs as schemathesis ships it.
"""

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

LIMIT_MESSAGES = (
    "exceeds the context length",          # prompt + max_new_tokens > context
    "more than the context length",        # an embedding input longer than the context
    "is out of range for vocabulary size",  # input_ids, stop_token_ids, logit_bias
    "encodes to no tokens",                # a text the tokenizer makes nothing of
    "is not live (live ranks",             # routed_dp_rank / X-Data-Parallel-Rank
    "is already in flight",                # a rid reused while its request runs
    "best_of greater than n",              # best_of must equal n
    "best_of must be >= n",
    "choices per request (prompts",        # prompts x n > 128
    "with the suffix -",                   # rid + "-<i>" longer than the rid limit
    "structured output is not available with this model",  # the built-in model: no byte pieces
    "does not compile",                    # a json_schema, regex, ebnf or response_format schema
    "no token of this model's vocabulary can start",
    "give at most one of sampling_params.json_schema",  # json_schema, regex, ebnf: one
    "ignore_eos cannot be combined with a structured output constraint",
    "needs the model's tool-call format",  # tool_choice auto on a template that writes none
    "cannot be combined with response_format",  # a forced tool_choice and response_format
    "tool calling on completions",         # tools are a chat field
    "which is not among the tools",        # a named tool_choice must name one of the tools
    "needs tools",                         # a tool_choice without tools
    "is given twice",                      # two tools of one name
)


def _is_limit_refusal(response):
    if response.status_code != 400:
        return False
    try:
        message = response.json()["error"]["message"]
    except Exception:  # not the documented error body: let the real check judge it
        return False
    return any(m in message for m in LIMIT_MESSAGES)


@schemathesis.check
def positive_data_acceptance_within_limits(ctx, response, case):
    if _is_limit_refusal(response):
        return None
    return positive_data_acceptance(ctx, response, case)
