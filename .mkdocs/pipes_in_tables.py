"""mkdocs hook: GitHub needs a pipe inside a table's code span escaped (`a\\|b`), Python-Markdown
shows the backslash. Inside code spans of table rows, the escape is dropped before rendering: the
tables extension already ignores pipes inside backticks."""
import re

CODE_SPAN = re.compile(r"`[^`\n]+`")


def on_page_markdown(markdown, **_):
    return "\n".join(CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line) if line.startswith("|") else line
                     for line in markdown.split("\n"))
