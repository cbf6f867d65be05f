"""``clustersim plan``'s search constraints, each list checked with one message naming the option: sizes,
shardings, recompute policies and the shardings of ``--stack``."""

from simulator.errors import ScenarioError


def _sizes(text: str | None, option: str) -> tuple[int, ...] | None:
    from simulator.scenario.section import MAX_GPUS

    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ScenarioError(
            f"{option}: expected whole numbers separated by commas, e.g. 1,2,4 (got {text!r})"
        ) from None
    if not values or min(values) < 1 or max(values) > MAX_GPUS:
        raise ScenarioError(f"{option}: each size must be between 1 and {MAX_GPUS:,} (got {text!r})")
    return values


def _choices(text: str | None, option: str, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    if text is None:
        return None
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    wrong = [v for v in values if v not in allowed]
    if not values or wrong:
        raise ScenarioError(f"{option}: {', '.join(wrong) or repr(text)} is not one of {', '.join(allowed)}")
    return values


def stack_shardings(stack: str, given: tuple[str, ...] | None) -> tuple[str, ...]:
    """The shardings ``plan --stack`` searches: the stack's own, narrowed by --sharding / --no-zero3."""
    from simulator.study.stacks import STACK_SHARDINGS

    own = STACK_SHARDINGS[stack]
    chosen = tuple(x for x in own if given is None or x in given)
    if not chosen:
        left = ", ".join(given or ())
        raise ScenarioError(
            f"--stack {stack} runs {', '.join(own)}; --sharding / --no-zero3 leave none of them ({left})"
        )
    return chosen


def search_options(tp, pp, pp_max, cp, mbs, ep, sharding, no_zero3, recompute, max_memory_gib) -> dict:
    """plan's search constraints as layouts.candidates takes them; each list checked with one message."""
    from simulator.study.layout import FULL_SHARDINGS, RECOMPUTE, SHARDINGS

    options: dict = {}
    for key, text, option in (("tp", tp, "--tp"), ("pp", pp, "--pp"), ("cp", cp, "--cp"), ("ep", ep, "--ep")):
        if (values := _sizes(text, option)) is not None:
            options[key] = values
    if (values := _sizes(mbs, "--mbs")) is not None:
        options["micro_batch_sizes"] = values
    if pp_max is not None:
        options["max_pp"] = pp_max
        if "pp" in options:
            options["pp"] = tuple(p for p in options["pp"] if p <= pp_max)
    shardings = _choices(sharding, "--sharding", SHARDINGS)
    if no_zero3:
        shardings = tuple(x for x in shardings or SHARDINGS if x not in FULL_SHARDINGS)
        if not shardings:
            raise ScenarioError("--no-zero3: leaves no sharding of those --sharding gives")
    if shardings is not None:
        options["shardings"] = shardings
    if (values := _choices(recompute, "--recompute", RECOMPUTE)) is not None:
        options["recompute"] = values
    if max_memory_gib is not None:
        options["max_memory_gib"] = max_memory_gib
    return options
