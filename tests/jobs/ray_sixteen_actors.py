"""A plain Ray job, unmodified by gkd: 16 actors, of which two never finish ``__init__`` and one never
finishes its third ``train`` call, which its 13 working peers finish in about half a second."""

import sys
import time

import ray

STUCK_IN_INIT = (3, 11)
STUCK_IN_TRAIN = 9


@ray.remote(num_cpus=0.1)
class Learner:
    def __init__(self, i: int):
        self.i = i
        time.sleep(3600 if i in STUCK_IN_INIT else 0.3)

    def train(self, step: int) -> int:
        if self.i == STUCK_IN_TRAIN and step == 2:
            time.sleep(3600)  # the line its stack must show
        time.sleep(0.5)
        return self.i


if __name__ == "__main__":
    ray.init(num_cpus=4, include_dashboard=False)
    learners = [Learner.remote(i) for i in range(16)]
    working = [a for i, a in enumerate(learners) if i not in STUCK_IN_INIT]
    for step in range(4):
        ray.get([a.train.remote(step) for a in working])
        print("STEP", step, flush=True)
    sys.exit(0)
