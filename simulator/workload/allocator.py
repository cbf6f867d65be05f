"""What PyTorch's caching allocator maps for a sequence of allocations and frees: a replay of its best fit.

PyTorch keeps freed blocks for reuse rather than returning them to the driver, so the memory it holds
(``torch.cuda.max_memory_reserved``, torchtitan's memory line) can exceed the most it ever had allocated
(``max_memory_allocated``) by holes no later request fits: a free block between two live ones that is smaller
than what is asked next. The allocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.1 to 2.13) serves a request
from the smallest cached free block that fits (``get_free_block``: the pool ordered by size, then address),
splits off the rest, merges a freed block with free neighbours (``free_block`` / ``try_merge_blocks``), and maps
new memory only when no cached block fits. With ``expandable_segments:True`` (torchtitan's run scripts) the new
memory extends one segment at its end; without it a new segment is allocated. Either way the memory held grows
by the request, so both are replayed alike: one address range, new memory at its top, a free block at the top
extended in place (expandable segments map the pages after it).

Pure functions on sizes in any unit (bytes, or bytes per logit for the loss's tensors, workload/memory.py).
"""

from __future__ import annotations

from collections.abc import Sequence

Event = tuple[str, float]  # ("+name", size): allocate; ("-name", 0): free that tensor


def replay(events: Sequence[Event], layout: list | None = None) -> tuple[float, float]:
    """(the most allocated at once, the most mapped) over ``events``, replayed on a best-fit allocator with
    coalescing that grows its one range at the top (module docstring). Sizes are kept exact: no rounding to the
    allocator's 512-byte or 2-MiB granules, which are nothing beside the tensors this is used for. ``layout``:
    a list to receive the blocks at the end, ``[start, size, name or None where free]`` in address order."""
    blocks: list[list] = [] if layout is None else layout
    where: dict[str, list] = {}
    allocated = peak = top = 0.0
    for event, size in events:
        name = event[1:]
        if event[0] == "+":
            fits = [b for b in blocks if b[2] is None and b[1] >= size]
            if fits:
                block = min(fits, key=lambda b: (b[1], b[0]))  # best fit, then the lowest address
                if block[1] > size:  # split: the rest stays free just above it
                    blocks.insert(blocks.index(block) + 1, [block[0] + size, block[1] - size, None])
                block[1], block[2] = size, name
            elif blocks and blocks[-1][2] is None:  # a free block at the top: extended in place
                block = blocks[-1]
                block[1], block[2] = size, name
                top = block[0] + size
            else:
                block = [top, size, name]
                blocks.append(block)
                top += size
            where[name] = block
            allocated += size
            peak = max(peak, allocated)
        else:
            if name not in where:  # allocated before the events began
                continue
            block = where.pop(name)
            allocated -= block[1]
            block[2] = None
            i = blocks.index(block)
            if i + 1 < len(blocks) and blocks[i + 1][2] is None:  # merge with the free block above
                block[1] += blocks.pop(i + 1)[1]
            if i > 0 and blocks[i - 1][2] is None:  # and below
                blocks[i - 1][1] += blocks.pop(i)[1]
    return peak, max(top, peak)
