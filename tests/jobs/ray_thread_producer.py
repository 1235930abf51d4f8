"""A plain Ray job of slime's shape, unmodified by gkd: a rollout buffer actor whose samples come from a
producer thread of its own (a queue.Queue between them), and a collector call that polls the queue with a
timeout until it has a batch, as slime's collector does; the driver trains on each batch. After HEALTHY_S
the producer thread dies with an error, and the collector polls on forever: busy, not progressing.

    python ray_thread_producer.py HEALTHY_S
"""

import queue
import sys
import threading
import time

import ray

WAIT_S = 3600  # every wait of the job has a bound; the stall holds until the run is stopped
BATCH = 4
POLL_S = 1.0  # the collector's poll of its queue


@ray.remote(num_cpus=0)
class RolloutBuffer:
    def __init__(self, dies_at: float):
        self.samples: queue.Queue = queue.Queue()
        self.dies_at = dies_at
        threading.Thread(target=self.produce, name="rollout-producer", daemon=True).start()

    def produce(self) -> None:
        n = 0
        while True:
            time.sleep(0.05)  # a rollout's generation
            if time.time() > self.dies_at:
                raise ValueError(f"sample {n} has no reward: the reward model answered None")
            self.samples.put({"n": n})
            n += 1

    def get_batch(self, size: int) -> list:
        batch = []
        while len(batch) < size:
            try:
                batch.append(self.samples.get(timeout=POLL_S))
            except queue.Empty:
                continue  # nothing yet: poll again
        return batch


if __name__ == "__main__":
    ray.init(num_cpus=2)
    dies_at = time.time() + float(sys.argv[1])
    buffer = RolloutBuffer.remote(dies_at)
    print("STALLED AT", dies_at, flush=True)  # when its producer thread will die
    while True:
        batch = ray.get(buffer.get_batch.remote(BATCH), timeout=WAIT_S)
        time.sleep(0.1)  # a step's training
