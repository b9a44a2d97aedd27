"""The job's status for people: a text summary (`sporenet-server status`) and the
operator's HTML page (served beside /metrics).

Both read the dict `status.read_status` returns: the job, its rounds and their metrics,
the participants of the open phase, the configuration and the privacy spent. The phase is
told in words ("round 3 of 10: training, waiting for 2 more updates"), times are local
clock times, and the page plots accuracy and loss per round as inline SVG (no script, no
external resources).
"""

from __future__ import annotations

import html
import math
import time
from collections import Counter
from typing import Any

PLOT_WIDTH, PLOT_HEIGHT, PAD = 560, 240, 54
RECENT_SHOWN = 12


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    return str(value)


def _fields(fields: dict[str, Any]) -> str:
    """An event's fields on one line, numbers shortened, at most 160 characters."""
    text = ", ".join(f"{k}={_short(v)}" for k, v in fields.items() if v not in ([], None, ""))
    return text if len(text) <= 160 else text[:157] + "..."


def _config(status: dict[str, Any]) -> dict[str, Any]:
    value = status.get("config")
    return value if isinstance(value, dict) else {}


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _ago(ts: float | None, now: float) -> str:
    if not ts:
        return ""
    seconds = max(0.0, now - ts)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def participant_counts(status: dict[str, Any]) -> dict[str, int]:
    """Clients of the open phase by state (selected, accepted, dropped...)."""
    return dict(Counter(str(v) for v in (status.get("participants") or {}).values()))


def phase_in_words(status: dict[str, Any], now: float | None = None) -> str:
    """What the job is doing, in a sentence."""
    now = time.time() if now is None else now
    job = status.get("job")
    if not job:
        return "no job yet: the daemon has not created it"
    config = _config(status)
    # An edge runs the cloud's rounds one at a time: its own round count means nothing.
    rounds = None if status.get("tier") == "edge" else config.get("rounds")
    buffered = (config.get("job") or {}).get("mode") == "async"
    where = f"{'buffer' if buffered else 'round'} {job['round']}" + (
        f" of {rounds}" if rounds else ""
    )
    if job["status"] == "finished":
        return f"finished after {where}" + (f": {job['reason']}" if job.get("reason") else "")
    if job["status"] == "failed":
        return f"failed in {where}: {job.get('reason') or 'no reason recorded'}"
    doing = "training (fit)" if job["phase"] == "fit" else "evaluating the model"
    if not job.get("active"):
        need = config.get("min_available") or config.get("min_clients") or "?"
        since = _ago(job.get("waiting_since"), now)
        return (
            f"{where}: waiting for clients before {doing} starts (needs {need} live; "
            f"{status.get('clients_registered', 0)} registered so far)"
            + (f", waiting since {since}" if since else "")
        )
    counts = participant_counts(status)
    selected = sum(counts.values())
    accepted = counts.get("accepted", 0)
    if buffered:
        size = (config.get("job") or {}).get("buffer_size", "?")
        return (
            f"{where} (asynchronous, on version {job.get('model_version', 0)}): {accepted} of "
            f"{size} updates in, {counts.get('selected', 0)} devices training"
        )
    secure = f", secure stage {status['secure_stage']}" if status.get("secure_stage") else ""
    left = max(0.0, float(job.get("deadline") or 0) - now)
    return (
        f"{where}: {doing}{secure}; {accepted} of {selected} selected clients answered, "
        f"deadline in {left:.0f} s"
    )


def round_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per round: fit loss, evaluate loss and accuracy, results, seconds."""
    rows: dict[int, dict[str, Any]] = {}
    for r in status.get("rounds") or []:
        row = rows.setdefault(int(r["round"]), {"round": int(r["round"])})
        metrics = r.get("metrics") or {}
        took = (
            float(r["finished_at"]) - float(r["started_at"])
            if r.get("finished_at") and r.get("started_at")
            else None
        )
        if r["phase"] == "fit":
            row.update(fit_loss=metrics.get("loss"), updates=r.get("num_results"), seconds=took)
        else:
            row.update(
                loss=metrics.get("loss"),
                accuracy=metrics.get("accuracy"),
                reports=r.get("num_results"),
            )
    return [rows[k] for k in sorted(rows)]


def privacy_in_words(status: dict[str, Any]) -> str:
    p = status.get("privacy") or {}
    if not p:
        return "differential privacy is off"
    budget = p.get("epsilon_budget")
    spent = float(p.get("epsilon") or 0.0)
    of = f" of a budget of {budget:g}" if budget else " (no budget set)"
    share = f" ({100 * spent / budget:.0f}%)" if budget else ""
    rounds = p.get("rounds", 0)
    count = len(rounds) if isinstance(rounds, list) else rounds
    return (
        f"{p.get('mode') or 'dp'}: epsilon {spent:.3g} spent{of}{share} at delta "
        f"{p.get('delta', 0):g}, over {count} published rounds"
    )


def _count(value: Any) -> str:
    return "-" if value is None else str(value)


def _num(value: Any, fmt: str = ".4f") -> str:
    return format(value, fmt) if isinstance(value, int | float) and math.isfinite(value) else "-"


def summary(status: dict[str, Any], now: float | None = None) -> str:
    """The status as text for a terminal."""
    now = time.time() if now is None else now
    job = status.get("job")
    config = _config(status)
    lines = [f"job: {phase_in_words(status, now)}"]
    if job:
        model = status.get("model") or {}
        lines.append(
            f"model: version {job['model_version']}"
            + (f" ({model.get('size', 0):,} bytes, {model.get('file')})" if model else "")
        )
    lines.append(
        f"clients: {status.get('clients_registered', 0)} registered"
        + "".join(f", {n} {state}" for state, n in sorted(participant_counts(status).items()))
    )
    if config:
        lines.append(
            f"settings: {config.get('rounds')} rounds, strategy "
            f"{(config.get('strategy') or {}).get('name', '?')}, min clients "
            f"{config.get('min_clients')}, min available "
            f"{config.get('min_available') or 'as min clients'}, fraction "
            f"{config.get('fraction')}"
        )
    lines.append(f"privacy: {privacy_in_words(status)}")
    rows = round_rows(status)
    if rows:
        lines += [
            "",
            f"{'round':>5} {'updates':>7} {'fit loss':>9} {'eval loss':>9} "
            f"{'accuracy':>8} {'seconds':>8}",
        ]
        lines += [
            f"{r['round']:>5} {_count(r.get('updates')):>7} "
            f"{_num(r.get('fit_loss')):>9} {_num(r.get('loss')):>9} "
            f"{_num(r.get('accuracy')):>8} {_num(r.get('seconds'), '.2f'):>8}"
            for r in rows
        ]
    return "\n".join(lines)


def _polyline(points: list[tuple[float, float]], colour: str) -> str:
    if not points:
        return ""
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in points)
    return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>{dots}'


def plot_svg(rows: list[dict[str, Any]]) -> str:
    """Accuracy (left axis, 0-1) and loss (right axis, 0-max) per round as inline SVG."""
    w, h, p = PLOT_WIDTH, PLOT_HEIGHT, PAD
    rounds = [r["round"] for r in rows] or [1]
    lo, hi = min(rounds), max(max(rounds), min(rounds) + 1)

    def x(r: float) -> float:
        return p + (r - lo) / (hi - lo) * (w - 2 * p)

    def series(key: str) -> list[tuple[int, float]]:
        return [
            (r["round"], float(r[key]))
            for r in rows
            if isinstance(r.get(key), int | float) and math.isfinite(r[key])
        ]

    acc = series("accuracy")
    loss = series("loss") or series("fit_loss")
    loss_name = "evaluation loss" if series("loss") else "training loss"
    top = max([v for _, v in loss], default=1.0) or 1.0
    grid = "".join(
        f'<line x1="{p}" x2="{w - p}" y1="{h - p - k / 4 * (h - 2 * p):.1f}" '
        f'y2="{h - p - k / 4 * (h - 2 * p):.1f}" stroke="#e3e8e6"/>'
        f'<text x="{p - 6}" y="{h - p - k / 4 * (h - 2 * p) + 4:.1f}" text-anchor="end">'
        f"{k / 4:.2f}</text>"
        f'<text x="{w - p + 6}" y="{h - p - k / 4 * (h - 2 * p) + 4:.1f}">'
        f"{top * k / 4:.2g}</text>"
        for k in range(5)
    )
    step = max(1, math.ceil((hi - lo) / 10))
    ticks = "".join(
        f'<text x="{x(r):.1f}" y="{h - p + 16}" text-anchor="middle">{r}</text>'
        for r in range(lo, hi + 1, step)
    )
    acc_points = [(x(r), h - p - v * (h - 2 * p)) for r, v in acc]
    loss_points = [(x(r), h - p - v / top * (h - 2 * p)) for r, v in loss]
    empty = (
        ""
        if acc or loss
        else f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle">no round finished yet</text>'
    )
    return (
        f'<svg id="plot" viewBox="0 0 {w} {h + 24}" role="img" '
        f'aria-label="accuracy and loss per round" font-size="13" fill="#45524d">'
        f"{grid}{ticks}"
        f'<line x1="{p}" x2="{w - p}" y1="{h - p}" y2="{h - p}" stroke="#45524d"/>'
        f'<text x="{w / 2}" y="{h - 4}" text-anchor="middle">round</text>'
        f'<text x="12" y="{h / 2}" transform="rotate(-90 12 {h / 2})" '
        f'text-anchor="middle">accuracy</text>'
        f'<text x="{w - 6}" y="{h / 2}" transform="rotate(90 {w - 6} {h / 2})" '
        f'text-anchor="middle">{loss_name}</text>'
        f"{_polyline(acc_points, '#2f6f5e')}{_polyline(loss_points, '#c0552f')}{empty}"
        f'<g transform="translate({p},{h + 12})">'
        f'<rect width="12" height="4" y="-4" fill="#2f6f5e"/><text x="16">accuracy</text>'
        f'<rect x="110" width="12" height="4" y="-4" fill="#c0552f"/>'
        f'<text x="126">{loss_name}</text></g></svg>'
    )


STYLE = """
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: #1d2a26; background: #eef3f1; }
header { background: #24473e; color: #fff; padding: 12px 18px; }
header h1 { margin: 0; font-size: 1.15rem; }
main { max-width: 1000px; margin: 0 auto; padding: 14px; display: grid; gap: 14px;
  grid-template-columns: minmax(0, 1fr); }
@media (min-width: 820px) {
  main { grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); }
  #rounds-card, #events-card { grid-column: 1 / -1; }
}
section { background: #fff; border: 1px solid #d6e0dc; border-radius: 12px; padding: 14px;
  min-width: 0; }
h2 { font-size: 1rem; margin: 0 0 8px; }
#phase { font-size: 1.05rem; margin: 0; }
.pill { display: inline-block; padding: 2px 10px; border-radius: 999px; background: #d8ebe4;
  color: #24473e; font-weight: 600; font-size: .85rem; margin: 2px 4px 2px 0; }
.pill.bad { background: #fbe6df; color: #a33a21; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums;
  font-size: .85rem; }
th, td { text-align: right; padding: 4px 5px; border-bottom: 1px solid #edf1ef; }
th { font-weight: 600; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
svg { width: 100%; height: auto; max-width: 640px; display: block; margin: 0 auto; }
.scroll { overflow-x: auto; }
.muted { color: #5b6b66; font-size: .85rem; }
meter { width: 100%; height: 14px; }
#events { padding-left: 1.1em; margin: 0; font-size: .88rem; }
#events li { margin: 2px 0; overflow-wrap: anywhere; }
code { font-size: .85rem; }
@media (max-width: 480px) {
  table { font-size: .78rem; }
  th, td { padding: 4px 3px; }
  main { padding: 10px; }
  section { padding: 12px 10px; }
}
"""


def render_page(
    status: dict[str, Any],
    events: list[dict[str, Any]],
    *,
    title: str = "sporenet-server",
    refresh: int = 5,
    now: float | None = None,
) -> str:
    """The operator's page: job, phase in words, participants, rounds plot and table,
    privacy against the budget, recent events. Reloads itself every `refresh` seconds."""
    now = time.time() if now is None else now
    e = html.escape
    state = str((status.get("job") or {}).get("status", "none"))
    cards = "\n".join(
        (
            _job_card(status, now, refresh),
            _participants_card(status),
            _rounds_card(status),
            _privacy_card(status),
            _events_card(events),
        )
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{refresh}">
<title>{e(title)}: {e(state)}</title>
<link rel="icon" href="data:,">
<style>{STYLE}</style></head>
<body><header><h1>{e(title)} <span class="pill" id="job-status">{e(state)}</span></h1></header>
<main>
{cards}
</main></body></html>
"""


def _job_card(status: dict[str, Any], now: float, refresh: int) -> str:
    """The job: its phase in words, model version, strategy, rounds, where the data is."""
    e = html.escape
    job = status.get("job") or {}
    config = _config(status)
    extent = (
        "an edge: it runs each of the cloud's rounds among its devices"
        if status.get("tier") == "edge"
        else f"{config.get('rounds', '?')} rounds"
    )
    return f"""<section id="job-card"><h2>Job</h2>
<p id="phase">{e(phase_in_words(status, now))}</p>
<p class="muted">model version {job.get("model_version", "-")}; strategy
{e(str((config.get("strategy") or {}).get("name", "-")))};
{extent};
updated {e(_when(now))} (reloads every {refresh} s; JSON at <a href="status.json">status.json</a>,
Prometheus at <a href="metrics">metrics</a>)</p></section>"""


def _participants_card(status: dict[str, Any]) -> str:
    """How many clients are registered, and one pill per participant state."""
    e = html.escape
    bad = {"dropped", "rejected", "excluded", "abandoned"}
    pills = (
        "".join(
            f'<span class="pill{" bad" if state in bad else ""}">{n} {e(state)}</span>'
            for state, n in sorted(participant_counts(status).items())
        )
        or '<span class="muted">no client selected in this phase</span>'
    )
    return f"""<section id="participants-card"><h2>Participants</h2>
<p>{status.get("clients_registered", 0)} clients registered</p><div id="participants">{pills}</div>
</section>"""


def _rounds_card(status: dict[str, Any]) -> str:
    """The rounds' accuracy and loss: a plot and a table."""
    rows = round_rows(status)
    table = (
        "".join(
            f"<tr><td>{r['round']}</td><td>{_count(r.get('updates'))}</td>"
            f"<td>{_num(r.get('fit_loss'))}</td><td>{_num(r.get('loss'))}</td>"
            f"<td>{_num(r.get('accuracy'))}</td><td>{_num(r.get('seconds'), '.2f')}</td></tr>"
            for r in rows
        )
        or '<tr><td colspan="6" class="muted">no round finished yet</td></tr>'
    )
    return f"""<section id="rounds-card"><h2>Accuracy and loss per round</h2>{plot_svg(rows)}
<div class="scroll"><table id="rounds"><thead><tr><th>round</th><th>updates</th>
<th>train loss</th><th>eval loss</th><th>accuracy</th><th>seconds</th></tr></thead>
<tbody>{table}</tbody></table></div>
<p class="muted">updates: clients' updates aggregated; train loss: their mean loss
while training (fit); eval loss and accuracy: their reports on the round's model
(evaluate phases, --evaluate-every); seconds: the fit phase's wall time.</p></section>"""


def _privacy_card(status: dict[str, Any]) -> str:
    """The privacy spent in words, and a meter against the budget when there is one."""
    p = status.get("privacy") or {}
    budget = p.get("epsilon_budget")
    meter = (
        f'<meter id="privacy-meter" min="0" max="{budget}" value="{float(p.get("epsilon", 0))}">'
        f"</meter>"
        if budget
        else ""
    )
    words = html.escape(privacy_in_words(status))
    return f"""<section id="privacy-card"><h2>Privacy</h2><p id="privacy">{words}</p>
{meter}</section>"""


def _events_card(events: list[dict[str, Any]]) -> str:
    """The last RECENT_SHOWN events, newest first."""
    e = html.escape
    items = (
        "".join(
            f"<li><b>{e(_when(ev.get('ts'))[11:])}</b> {e(str(ev.get('event')))}"
            + (f" <code>{e(_fields(ev['fields']))}</code>" if ev.get("fields") else "")
            + "</li>"
            for ev in reversed(events[-RECENT_SHOWN:])
        )
        or '<li class="muted">no event since the daemon started</li>'
    )
    return f'<section id="events-card"><h2>Recent events</h2><ul id="events">{items}</ul></section>'
