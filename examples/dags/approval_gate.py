"""An approval gate before a publish step, and a form for the figures to book.

Finance approves the day's settlement file before it is published; a rejection skips the
publish step (the run still ends SUCCESS). Nobody answering within 8 hours rejects it
(the default answer). Answer on the page's "Needs you" list, by
``slotless respond RUN sign_off --approve``, or ``POST /api/v1/runs/RUN/tasks/sign_off/response``.
"""

from pydantic import BaseModel, Field

from executor import DAG
from triggers.people import Approval, Form

dag = DAG("approval_gate", schedule="@daily", catchup=False)


@dag.task
def build_file(ctx):
    return {"path": f"/data/settlements/{ctx.ds}.csv", "rows": 1204, "total": "18,230.55 EUR"}


sign_off = dag.sensor(
    "sign_off",
    Approval(
        subject="Publish the settlement file of {{ ds }}?",
        body=(
            "The file for **{{ ds }}** is built.\n\n"
            "- check the total against the bank statement\n"
            "- reject if anything is off: nothing is published"
        ),
        respondents=["alice", "bob"],  # token names (slotless ui --token alice:...,bob:...)
        default={"approve": False},  # taken when the timeout passes
    ),
    parents=[build_file],
    timeout="8h",
)


@dag.task(parents=[build_file, sign_off])
def publish(ctx):
    answer = ctx.inputs["sign_off"]  # {"approved": True, "by": "alice", "at": ..., ...}
    return f"published {ctx.inputs['build_file']['path']} (approved by {answer['by']})"


class Booking(BaseModel):
    amount: int = Field(ge=0, description="in cents")
    currency: str = "EUR"
    reference: str = Field(min_length=3)


figures = dag.sensor(
    "figures",
    Form(subject="Book the fees of {{ ds }}", model=Booking, respondents=["alice"]),
    parents=[publish],
    timeout="1d",
)


@dag.task(parents=[figures])
def book(ctx):
    return ctx.inputs["figures"]["form"]
