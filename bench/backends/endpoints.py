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
    from verdict.data_gen.teacher_config import TeacherConfig, load_teacher

    try:
        endpoint = load_teacher(ref) if isinstance(ref, str) else TeacherConfig.model_validate(ref)
    except ValidationError as e:
        raise BenchError(f"{what}: invalid inline endpoint", describe(e, TeacherConfig)) from None
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
            endpoint = TeacherConfig.model_validate({**endpoint.model_dump(), "base_url": url})
        except ValidationError as e:
            raise BenchError(f"{what}: bad base_url", describe_validation_error(e, "base_url")) from None
    return endpoint
