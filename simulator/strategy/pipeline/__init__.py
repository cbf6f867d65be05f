"""The pipeline core that Megatron's schedules (``megatron.py``) and DeepSpeed's engine (``deepspeed_pipe.py``)
share: which layers each stage and model chunk holds (``partition.py``), the ops of one chunk's forward and
backward with its pipeline transfers (``chunk_ops.py``), the task id of each stage's steps (``step_ids.py``), the
end of the iteration (``flush.py``: gradient reduction, tied embedding, optimizer step) and a stage's memory
from the schedule's activations in flight (``memory.py``). The order of the steps is a schedule's
(``strategy/schedules/``)."""
