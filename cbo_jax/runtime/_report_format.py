"""A report's blocks written out as HTML (self-contained) or Markdown (images beside it),
every text from the results directory escaped (:mod:`cbo_jax.runtime.report`)."""

from __future__ import annotations

import base64
import html
import re
import urllib.parse
from pathlib import Path

from cbo_jax.runtime._report_data import _LINK

# A report is a list of blocks, rendered to HTML or Markdown at the end:
#   ("h", level, text) ("p", text) ("table", header, rows) ("img", png_bytes, caption, name)


class _Code(str):
    """A part of a paragraph shown as code (a file name, a command); other parts are plain text."""


_CSS = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.85rem}td,th{border:1px solid #ccc;padding:.2rem .5rem;
text-align:left}th{background:#f3f3f3}img{max-width:100%;margin:.5rem 0}h2{border-bottom:1px solid #ddd}
code{background:#f5f5f5;padding:0 .2rem}figure{margin:0 0 1rem}figcaption{font-size:.8rem;color:#555}"""


def _html_parts(parts: tuple) -> str:
    return "".join(f"<code>{html.escape(p)}</code>" if isinstance(p, _Code) else html.escape(p) for p in parts)


def _to_html(blocks: list[tuple]) -> str:
    body = []
    for b in blocks:
        if b[0] == "h":
            body.append(f"<h{b[1]}>{html.escape(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            body.append(f"<p>{_html_parts(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif b[0] == "img":
            data = base64.b64encode(b[1]).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{html.escape(b[2])}</figcaption></figure>")
    title = html.escape(blocks[0][2]) if blocks and blocks[0][0] == "h" else "cbo_jax report"
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style>"
            f"</head><body>\n" + "\n".join(body) + "\n</body></html>\n")


_LINE_BREAKS = re.compile(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+")


def _md_text(text: str) -> str:
    """Text from the results directory as Markdown shows it literally: HTML-significant characters as
    entities (no tag, no autolink), Markdown's own escaped (no code span, emphasis, link or image),
    line breaks as spaces (no new block: a heading, a table row)."""
    text = _LINE_BREAKS.sub(" ", text)
    text = re.sub(r"([\\`*\[\]#~])", r"\\\1", text)
    text = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)  # snake_case stays readable
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _md_code(text: str) -> str:
    """``text`` as a Markdown code span, shown as it is: the fence is one backtick longer than the
    longest run of backticks in it (a backtick in a name would end the span), padded with a space where
    the text begins or ends with a backtick (CommonMark strips one space on each side)."""
    text = _LINE_BREAKS.sub(" ", text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip()) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_cell(text: str) -> str:
    return _md_text(text).replace("|", "\\|")


def _to_markdown(blocks: list[tuple], out_path: Path) -> str:
    files = out_path.parent / f"{out_path.stem}_files"
    lines = []
    for b in blocks:
        if b[0] == "h":
            lines.append(f"{'#' * b[1]} {_md_text(b[2])}\n")
        elif b[0] == "p":
            lines.append("".join(_md_code(p) if isinstance(p, _Code) else _md_text(p) for p in b[1]) + "\n")
        elif b[0] == "table":
            lines.append("| " + " | ".join(_md_cell(h) for h in b[1]) + " |")
            lines.append("|" + " --- |" * len(b[1]))
            lines.extend("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b[2])
            lines.append("")
        elif b[0] == "img":
            if files.is_symlink():
                raise OSError(f"{files} is {_LINK}: the report's images are not written through it")
            files.mkdir(parents=True, exist_ok=True)
            image = files / b[3]
            if image.is_symlink():  # the report's own folder: a link there is replaced, never written through
                image.unlink()
            image.write_bytes(b[1])
            lines.append(f"![{_md_text(b[2])}]({urllib.parse.quote(f'{files.name}/{b[3]}')})\n")  # a space ends a link
    return "\n".join(lines)
