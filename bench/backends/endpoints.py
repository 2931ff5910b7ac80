"""Where a backend's formalizer calls go: a teacher config (configs/teachers/NAME.yaml, a path,
or an inline mapping), optionally moved to another base URL or to the vLLM server the run starts."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..protocol import BenchError

EndpointRef = str | dict[str, Any]


class EndpointPlacement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(
        None, description="send the calls here instead of the endpoint config's base_url"
    )
    local_vllm: bool = Field(
        False, description="send the calls to the vLLM server this run starts (config 'vllm')"
    )


def resolve_endpoint(ref: EndpointRef, placement: EndpointPlacement, vllm_url: str | None, what: str):
    from pydantic import ValidationError
    from verdict.core.configs import describe
    from verdict.core.errors import VerdictError, describe_validation_error
    from verdict.data_gen.formalizer import EndpointConfig, load_teacher

    try:
        endpoint = load_teacher(ref) if isinstance(ref, str) else EndpointConfig.model_validate(ref)
    except ValidationError as e:
        raise BenchError(f"{what}: invalid inline endpoint", describe(e, EndpointConfig)) from None
    except VerdictError as e:
        raise BenchError(f"{what}: {e}") from None
    url = placement.base_url
    if placement.local_vllm:
        if vllm_url is None:
            raise BenchError(
                f"{what}: local_vllm needs the run's 'vllm' server (add a 'vllm' block to the config)"
            )
        url = vllm_url
    if url:
        try:
            endpoint = EndpointConfig.model_validate({**endpoint.model_dump(), "base_url": url})
        except ValidationError as e:
            raise BenchError(f"{what}: bad base_url", describe_validation_error(e, "base_url")) from None
    return endpoint


def endpoint_with_stages(endpoint, limits: dict[str, int]):
    """The endpoint config with output limits for stages `data_gen` does not know (a bench stage)."""
    from pydantic import create_model
    from verdict.data_gen.formalizer import EndpointConfig, StageTokens

    tokens = create_model(
        "BenchStageTokens", __base__=StageTokens, **{k: (int, Field(v, gt=0)) for k, v in limits.items()}
    )
    with_stages = create_model("BenchEndpoint", __base__=EndpointConfig, max_tokens=(tokens, ...))
    data = endpoint.model_dump()
    data["max_tokens"] = {**data["max_tokens"], **limits}
    return with_stages.model_validate(data)


def typed_check(model, limit: int):
    """The check of a bench stage's answer: JSON within the output limit, then the typed model (a
    `Check` with the problems for the one repair, or with the validated output)."""
    from pydantic import ValidationError
    from verdict.core.errors import describe_validation_error
    from verdict.data_gen.formalizer import Check, parse_json

    def validate(call) -> Check:
        obj, problems = parse_json(call.content, call.finish_reason, limit)
        if problems:
            return Check(problems)
        try:
            out = model.model_validate(obj)
        except ValidationError as e:
            return Check([("schema", p) for p in describe_validation_error(e, "output")])
        return Check([], out, out.model_dump_json())

    return validate
