"""HTML attachments as text: blocks become paragraphs, scripts vanish, the same input gives the same text."""

from verdict.data_gen.fhir.html_text import html_to_text


def test_blocks_breaks_entities_and_scripts():
    html = (
        "<html><head><title>t</title><script>alert(1)</script></head><body><h1>Labs</h1>"
        "<p>Creatinine:&nbsp;0.9&#160;mg/dL<br>A1c &lt; 12%</p><ul><li>one</li><li>two</li></ul>"
        "<table><tr><td>Na</td><td>140</td></tr></table><style>p{}</style></body></html>"
    )
    text = html_to_text(html)
    assert text == "Labs\n\nCreatinine:\xa00.9\xa0mg/dL\nA1c < 12%\n\none\n\ntwo\n\nNa | 140"
    assert html_to_text(html) == text
    assert "alert" not in text and "p{}" not in text
