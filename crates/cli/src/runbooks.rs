//! `GET /runbooks`: the README's "Alerts and runbooks" section as a page of the API, so every
//! alert's `runbook_url` resolves wherever stormglass runs (no network beyond it). The text
//! is the README's, compiled in: one source for the repository and the binary.

use std::sync::LazyLock;

use pulldown_cmark::{Event, HeadingLevel, Parser, Tag, TagEnd, html};

const README: &str = include_str!("../../../README.md");
const SECTION: &str = "## Alerts and runbooks";

/// The page, rendered once.
pub static PAGE: LazyLock<String> = LazyLock::new(|| page(README));

fn page(readme: &str) -> String {
    let start = readme.find(SECTION).unwrap_or(0);
    let rest = &readme[start..];
    let end = rest[SECTION.len()..]
        .find("\n## ")
        .map_or(rest.len(), |i| i + SECTION.len());
    let mut body = String::new();
    html::push_html(&mut body, with_anchors(&rest[..end]).into_iter());
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
                id: Some(anchor(&text).into()),
                classes: Vec::new(),
                attrs: Vec::new(),
            });
        }
        i += 1;
    }
    events
}

fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
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
            !PAGE.contains("id=\"architecture\""),
            "the page is the runbook section only"
        );
    }

    /// Anchors are GitHub's: lower case, dashes for spaces, punctuation dropped.
    #[test]
    fn anchors_follow_github() {
        assert_eq!(anchor("StormglassDown"), "stormglassdown");
        assert_eq!(anchor("Alerts and runbooks"), "alerts-and-runbooks");
        assert_eq!(anchor("What `cause` means (v2)"), "what-cause-means-v2");
    }
}
