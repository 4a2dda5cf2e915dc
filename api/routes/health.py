from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter
from pydantic import BaseModel
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from api.deps import ClientDep

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str
    temporal: bool


@router.get("/health", response_model=Health)
async def health(client: ClientDep) -> Health:
    """Liveness plus whether the Temporal server answers."""
    try:
        await client.workflow_service.get_system_info(
            GetSystemInfoRequest(), timeout=timedelta(seconds=2)
        )
        ok = True
    except Exception:
        ok = False
    return Health(status="ok" if ok else "degraded", temporal=ok)
