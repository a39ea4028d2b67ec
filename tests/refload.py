"""Driving a request plan at the reference server, shared by the load-generator tests."""

from __future__ import annotations

import asyncio

from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.measure.loadgen import run_plan
from bakeoff.results.records import RequestRecord
from bakeoff.workloads.plans import RunPlan

MODEL = "bakeoff-ref"


def drive(base_url: str, plan: RunPlan) -> list[RequestRecord]:
    async def main() -> list[RequestRecord]:
        async with StreamingClient(ClientSettings(base_url=base_url, model=MODEL)) as client:
            return await run_plan(client, plan, lambda r: None, show_progress=False)

    return asyncio.run(main())
