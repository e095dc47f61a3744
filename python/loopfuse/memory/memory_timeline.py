"""A hand-written SVG picture of live bytes over a program's schedule: one polyline (a step line,
one step per schedule position), the peak marked, and under it one bar per labelled buffer over the
positions where it is live."""
from xml.sax.saxutils import escape

WIDTH, PLOT_HEIGHT, BAR_HEIGHT, MARGIN = 960, 260, 18, 48
CHAR_WIDTH = 6.5     # about, for 12px sans-serif: where a label fits beside its bar


def svg(live_bytes, peak: int, peak_label: str, bars=(), title: str = "") -> str:
    """The picture: `live_bytes` per position, the peak at position `peak` labelled `peak_label`, and
    `bars` as ``(first, last, label)`` live ranges.

    Examples:
        >>> import xml.etree.ElementTree as ET
        >>> root = ET.fromstring(svg([0, 4, 2], 1, "4 B", [(1, 1, "x <f32[1]>")], "t"))
        >>> [e.tag.split("}")[1] for e in root].count("polyline")
        1
    """
    n = max(len(live_bytes), 1)
    top = max(max(live_bytes, default=0), 1)
    plot_width = WIDTH - 2 * MARGIN
    height = MARGIN + PLOT_HEIGHT + 24 + len(bars) * (BAR_HEIGHT + 4) + MARGIN // 2

    def x(position: float) -> float:
        return MARGIN + plot_width * position / n

    def y(value: float) -> float:
        return MARGIN + PLOT_HEIGHT * (1 - value / top)

    right_of_peak = x(peak + 0.5) + 6 + CHAR_WIDTH * len(peak_label) <= WIDTH
    points = []
    for position, value in enumerate(live_bytes):
        points += [(x(position), y(value)), (x(position + 1), y(value))]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
           f"<title>{escape(title)}</title>",
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{MARGIN}" y="{MARGIN - 24}" font-size="14">{escape(title)}</text>',
           f'<line x1="{MARGIN}" y1="{y(0)}" x2="{x(n)}" y2="{y(0)}" stroke="black"/>',
           f'<line x1="{MARGIN}" y1="{y(0)}" x2="{MARGIN}" y2="{y(top)}" stroke="black"/>',
           f'<text x="{MARGIN - 4}" y="{y(0)}" text-anchor="end">0</text>',
           f'<text x="{x(n)}" y="{y(0) + 16}" text-anchor="end">schedule position {n - 1}</text>',
           f'<polyline fill="none" stroke="steelblue" stroke-width="1.5" points="'
           + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + '"/>',
           f'<line x1="{x(peak + 0.5):.1f}" y1="{y(0)}" x2="{x(peak + 0.5):.1f}" y2="{y(top)}" stroke="crimson" '
           'stroke-dasharray="4 3"/>',
           f'<circle cx="{x(peak + 0.5):.1f}" cy="{y(top):.1f}" r="4" fill="crimson"/>',
           f'<text x="{x(peak + 0.5) + (6 if right_of_peak else -6):.1f}" y="{y(top) + 4:.1f}" fill="crimson" '
           f'text-anchor="{"start" if right_of_peak else "end"}">{escape(peak_label)}</text>']
    for row, (first, last, label) in enumerate(bars):
        top_y = MARGIN + PLOT_HEIGHT + 24 + row * (BAR_HEIGHT + 4)
        left, right = x(first), max(x(last + 1), x(first) + 2)
        wide = CHAR_WIDTH * len(label)
        anchor, at = (("start", right + 4) if right + 4 + wide <= WIDTH else
                      ("end", left - 4) if left - 4 - wide >= 0 else ("start", left + 4))
        out += [f'<rect x="{left:.1f}" y="{top_y}" width="{right - left:.1f}" height="{BAR_HEIGHT}" '
                'fill="steelblue" fill-opacity="0.35"/>',
                f'<text x="{at:.1f}" y="{top_y + BAR_HEIGHT - 5}" text-anchor="{anchor}">{escape(label)}</text>']
    return "\n".join(out + ["</svg>"]) + "\n"
