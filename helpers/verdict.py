"""The three-way memory verdict: "fits", "tight" or "does not fit", for one place (GPU, host RAM,
disk) or all of them. Pure arithmetic on byte counts, so every layer above can use it.

"tight" means the prediction is within :data:`MARGIN` of the limit: the run may still fail. The
margin covers what a peak-allocation estimate cannot see: the caching allocator's rounding and
fragmentation (a capped GPU fails when *reserved* memory reaches the cap, not allocated memory;
GPT-2 774M at stage 3 ran out with 13.21 GiB allocated of 15) and the estimator's own error. It is
chosen so that no out-of-memory case of the measurements (helpers/memory_measurements.json) is
"fits" (tests/test_memory_validation.py checks that on the validation half).
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.show import GiB

FITS, TIGHT, NO_FIT = "fits", "tight", "does not fit"
#: How close to a limit a prediction may come and still be called "fits": within 10% is "tight".
MARGIN = 0.10
#: The places a verdict speaks of, and their names in sentences.
PLACES = {"gpu": "GPU", "cpu": "host RAM", "nvme": "NVMe disk"}


def verdict(need: int | float, limit: int | float | None, margin: float = MARGIN) -> str:
    """"fits" when ``need`` <= (1 - margin) x ``limit``, "tight" up to the limit, else "does not
    fit".

    A limit of None means the place does not exist here (no GPU): anything needed there does not
    fit,
    nothing needed fits. A negative need or margin outside [0, 1) is a caller's bug (ValueError)."""
    if need < 0 or not 0 <= margin < 1:
        raise ValueError(
            f"need must be >= 0 and margin in [0, 1): got need={need}, margin={margin}"
        )
    if limit is None:
        return FITS if not need else NO_FIT
    if need <= (1 - margin) * limit:
        return FITS
    return TIGHT if need <= limit else NO_FIT


@dataclass(frozen=True)
class PlaceVerdict:
    """One place's need, limit and verdict."""

    place: str
    need: int
    limit: int | None
    word: str

    def sentence(self) -> str:
        """``GPU: 14.61 of 15.0 GiB: tight (within 10% of the limit)``."""
        limit = "no such device here" if self.limit is None else f"{self.limit / GiB:.1f} GiB"
        why = f" (within {MARGIN:.0%} of the limit)" if self.word == TIGHT else ""
        name = PLACES.get(self.place, self.place)
        return f"{name}: {self.need / GiB:.2f} of {limit}: {self.word}{why}"


def worst(words: list[str]) -> str:
    """The overall verdict of several places: the worst of them ("fits" only when all fit)."""
    order = [FITS, TIGHT, NO_FIT]
    return max(words, key=order.index) if words else FITS


def places(
    needs: dict[str, int], limits: dict[str, int | None], margin: float = MARGIN
) -> dict[str, PlaceVerdict]:
    """A verdict for every place that needs bytes (and always for "gpu" and "cpu" when limited)."""
    out = {}
    for place in PLACES:
        need = int(needs.get(place, 0))
        if need or (place in limits and limits[place] is not None and place != "nvme"):
            limit = limits.get(place)
            out[place] = PlaceVerdict(place, need, limit, verdict(need, limit, margin))
    return out
