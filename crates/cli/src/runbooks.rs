//! `GET /runbooks`: docs/alerts.md ("Alerts and runbooks") as a page of the API, so every
//! alert's `runbook_url` resolves wherever stormglass runs (no network beyond it). The text
//! is the docs page, compiled in: one source for the repository and the binary.

use std::sync::LazyLock;

use pulldown_cmark::{Event, HeadingLevel, Parser, Tag, TagEnd, html};
use stormglass_export::rules::heading_anchor;

const ALERTS: &str = include_str!("../../../docs/alerts.md");

/// The page, rendered once.
pub static PAGE: LazyLock<String> = LazyLock::new(|| page(ALERTS));

fn page(markdown: &str) -> String {
    let mut body = String::new();
    html::push_html(&mut body, with_anchors(markdown).into_iter());
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>stormglass runbooks</title><style>\
         body{{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;line-height:1.5}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2rem .5rem}}\
         code{{background:#f3f3f3;padding:0 .2rem}}h3:target{{background:#fff3c4}}\
         </style></head><body>\n{body}</body></html>\n"
    )
}

/// The Markdown's events, with each heading given the anchor GitHub gives it (lower case,
/// spaces as dashes, other punctuation dropped): the `#stormglassretrystormpotential` of
/// every alert's runbook link.
fn with_anchors(markdown: &str) -> Vec<Event<'_>> {
    let mut events: Vec<Event> =
        Parser::new_ext(markdown, pulldown_cmark::Options::ENABLE_TABLES).collect();
    let mut i = 0;
    while i < events.len() {
        if let Event::Start(Tag::Heading { level, .. }) = &events[i] {
            let level: HeadingLevel = *level;
            let mut text = String::new();
            for e in &events[i + 1..] {
                match e {
                    Event::End(TagEnd::Heading(_)) => break,
                    Event::Text(t) | Event::Code(t) => text.push_str(t),
                    _ => {}
                }
            }
            events[i] = Event::Start(Tag::Heading {
                level,
                id: Some(heading_anchor(&text).into()),
                classes: Vec::new(),
                attrs: Vec::new(),
            });
        }
        i += 1;
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alert's runbook link (rules and built-in evaluator) lands on a heading of the
    /// page: figure alerts and the meta-monitoring ones.
    #[test]
    fn every_runbook_anchor_is_on_the_page() {
        let anchors = stormglass_analytics::alerts::DEFINITIONS
            .iter()
            .map(|d| d.runbook_anchor())
            .chain(stormglass_export::rules::self_alert_names().map(str::to_ascii_lowercase));
        for anchor in anchors {
            assert!(
                PAGE.contains(&format!("<h3 id=\"{anchor}\">")),
                "no runbook for #{anchor}"
            );
        }
        assert!(
            PAGE.contains("<h1 id=\"alerts-and-runbooks\">"),
            "the page is docs/alerts.md"
        );
    }

    /// Anchors are GitHub's: lower case, dashes for spaces, punctuation dropped.
    #[test]
    fn anchors_follow_github() {
        assert_eq!(heading_anchor("StormglassDown"), "stormglassdown");
        assert_eq!(heading_anchor("Alerts and runbooks"), "alerts-and-runbooks");
        assert_eq!(
            heading_anchor("What `cause` means (v2)"),
            "what-cause-means-v2"
        );
    }
}
