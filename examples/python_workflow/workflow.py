"""A Trinity-RFT workflow written as a Trinity-RFT user writes one: it subclasses Trinity-RFT's `Workflow`, samples
the task's group with one `self.model.chat` call and scores each reply itself.

The task: the two-digit additions of examples/quickstart. The reward is 1 for the right sum as the reply's last
number, plus 0.1 when the reply is the number alone; both parts are reported as metrics, so they reach
`rollout/correct/mean` and `rollout/format_reward/mean` in the run's metrics.
"""

import re
from typing import List

from trinity.common.experience import Experience
from trinity.common.workflows.workflow import Task, Workflow

SYSTEM_PROMPT = "You are a calculator. Reply with the sum only."


class AdditionWorkflow(Workflow):
    """One question, `repeat_times` sampled answers (one `chat` call with `n`), each rewarded on its own."""

    can_reset = True
    can_repeat = True

    def __init__(self, *, task: Task, model, auxiliary_models=None):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    def reset(self, task: Task):
        self.question = task.raw_task["question"]
        self.answer = str(task.raw_task["answer"]).strip()
        self.temperature = task.rollout_args.temperature

    def set_repeat_times(self, repeat_times, run_id_base):
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base

    def run(self) -> List[Experience]:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.question},
        ]
        responses = self.model.chat(messages, n=self.repeat_times, temperature=self.temperature)
        for i, response in enumerate(responses):
            correct, formatted = self.score(response.response_text or "")
            response.reward = correct + 0.1 * formatted
            response.metrics = {"correct": correct, "format_reward": formatted}
            response.eid.run = self.run_id_base + i
        return responses

    def score(self, reply: str):
        numbers = re.findall(r"-?\d+", reply)
        correct = 1.0 if numbers and numbers[-1] == self.answer else 0.0
        formatted = 1.0 if re.fullmatch(r"\s*-?\d+\s*", reply) else 0.0
        return correct, formatted
