"""Alpha (latency) and beta (inverse bandwidth) of a collective, fitted to times that
``ddl doctor --collectives`` measured (ddl.commands.collective_probe); the step-time model
(ddl.planning.step_time_model) then prices each collective as alpha x messages + beta x
bytes on the wire (``ring_factors``)."""

from __future__ import annotations

from ddl.planning.collective_cost import ring_factors


def fit(points: list[tuple[str, int, float]], p: int) -> dict[str, float]:
    """Least-squares alpha (s) and bandwidth (bytes/s) from measured ``(op, bytes,
    seconds)`` over ``p`` ranks, each point weighted by 1 / its time (relative errors: the
    small messages set alpha, the large ones beta). A negative solution for either is
    clamped to 0 and the other refitted alone. ``worst_error``: the largest relative
    deviation of a point from the fitted line."""
    rows = []
    for op, nbytes, seconds in points:
        messages, share = ring_factors(op, p)
        if seconds > 0 and (messages or share):
            rows.append((messages / seconds, share * nbytes / seconds))
    if len(rows) < 2:
        raise ValueError("fitting alpha and beta needs at least two timed sizes")
    # minimise sum((a alpha + b beta - 1)^2): the normal equations of the weighted problem
    saa = sum(a * a for a, _ in rows)
    sab = sum(a * b for a, b in rows)
    sbb = sum(b * b for _, b in rows)
    sa1 = sum(a for a, _ in rows)
    sb1 = sum(b for _, b in rows)
    det = saa * sbb - sab * sab
    alpha = (sa1 * sbb - sb1 * sab) / det if det else 0.0
    beta = (saa * sb1 - sab * sa1) / det if det else 0.0
    if alpha < 0 or not det:
        alpha, beta = 0.0, sb1 / sbb
    elif beta <= 0:
        alpha, beta = sa1 / saa, 0.0
    worst = max(abs(a * alpha + b * beta - 1) for a, b in rows)
    return {"latency_s": alpha, "bytes_per_s": 1 / beta if beta > 0 else float("inf"),
            "worst_error": worst, "points": len(rows)}
