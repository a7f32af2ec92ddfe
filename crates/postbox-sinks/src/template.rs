//! Topic templates: a destination name with placeholders, parsed once and rendered per event.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use postbox::{OutboxEvent, PublishError};

/// A destination name (subject, routing key, topic, stream key, URL) with placeholders filled in
/// from each event.
///
/// Placeholders: `{event_type}`, `{aggregate_type}`, `{aggregate_id}`, `{tenant}`,
/// `{schema_version}`. Write `{{` and `}}` for literal braces. The template is parsed once, when
/// the sink's configuration is read; an unknown placeholder or an unclosed brace is refused then,
/// with an error naming it.
///
/// Rendering an event that lacks a value the template needs (an event without an aggregate, or
/// of the default tenant, for `{tenant}`) fails with a permanent [`PublishError`]: retrying cannot
/// give the event the missing value. Values are inserted as they are; a broker that gives
/// characters a meaning (a `.` in a NATS subject, a `/` in an MQTT topic) sees them.
///
/// ```
/// use postbox_sinks::Template;
///
/// let template: Template = "billing.{aggregate_type}.{event_type}".parse().unwrap();
/// assert_eq!(template.as_str(), "billing.{aggregate_type}.{event_type}");
///
/// let err = "billing.{aggregate}".parse::<Template>().unwrap_err();
/// assert!(err.to_string().contains("{aggregate}"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Field(Field),
}

/// The event fields a template can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    EventType,
    AggregateType,
    AggregateId,
    Tenant,
    SchemaVersion,
}

impl Field {
    const ALL: [Field; 5] = [
        Field::EventType,
        Field::AggregateType,
        Field::AggregateId,
        Field::Tenant,
        Field::SchemaVersion,
    ];

    fn name(self) -> &'static str {
        match self {
            Field::EventType => "event_type",
            Field::AggregateType => "aggregate_type",
            Field::AggregateId => "aggregate_id",
            Field::Tenant => "tenant",
            Field::SchemaVersion => "schema_version",
        }
    }

    fn value(self, event: &OutboxEvent) -> Option<Cow<'_, str>> {
        match self {
            Field::EventType => Some(Cow::Borrowed(&event.event_type)),
            Field::AggregateType => event.aggregate_type.as_deref().map(Cow::Borrowed),
            Field::AggregateId => event.aggregate_id.as_deref().map(Cow::Borrowed),
            Field::Tenant => event.tenant.as_deref().map(Cow::Borrowed),
            Field::SchemaVersion => Some(Cow::Owned(event.schema_version.to_string())),
        }
    }
}

/// Why a template was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// A placeholder names no known field.
    #[error(
        "template {template:?} has an unknown placeholder {{{name}}}; the known ones are \
         {{event_type}}, {{aggregate_type}}, {{aggregate_id}}, {{tenant}} and {{schema_version}}"
    )]
    UnknownPlaceholder {
        /// The template as written.
        template: String,
        /// The unknown name, without braces.
        name: String,
    },
    /// A `{` has no matching `}`.
    #[error(
        "template {template:?} has a `{{` at byte {at} that is never closed (write `{{{{` for a literal brace)"
    )]
    Unclosed {
        /// The template as written.
        template: String,
        /// Byte offset of the opening brace.
        at: usize,
    },
    /// A `}` has no opening `{`.
    #[error(
        "template {template:?} has a `}}` at byte {at} without an opening `{{` (write `}}}}` for a literal brace)"
    )]
    UnmatchedClose {
        /// The template as written.
        template: String,
        /// Byte offset of the closing brace.
        at: usize,
    },
    /// The template is empty.
    #[error("template is empty; name a destination, e.g. \"events.{{event_type}}\"")]
    Empty,
}

/// An event lacks a value its destination template needs.
///
/// It converts into a permanent [`PublishError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "event {event_id} has no {placeholder}, which the destination template {template:?} needs; \
     give the event one or route it to a sink whose template does not use {{{placeholder}}}"
)]
pub struct RenderError {
    /// The event's id.
    pub event_id: i64,
    /// The placeholder without a value, without braces.
    pub placeholder: &'static str,
    /// The template as written.
    pub template: String,
}

impl From<RenderError> for PublishError {
    fn from(err: RenderError) -> Self {
        PublishError::permanent(err)
    }
}

impl Template {
    /// Parses `template`, refusing unknown placeholders and unbalanced braces.
    pub fn parse(template: &str) -> Result<Template, TemplateError> {
        if template.is_empty() {
            return Err(TemplateError::Empty);
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = template.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, n)| n) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|&(_, n)| n) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for (_, n) in chars.by_ref() {
                        if n == '}' {
                            closed = true;
                            break;
                        }
                        name.push(n);
                    }
                    if !closed {
                        return Err(TemplateError::Unclosed {
                            template: template.to_owned(),
                            at,
                        });
                    }
                    let field = Field::ALL
                        .into_iter()
                        .find(|f| f.name() == name)
                        .ok_or_else(|| TemplateError::UnknownPlaceholder {
                            template: template.to_owned(),
                            name: name.clone(),
                        })?;
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(field));
                }
                '}' => {
                    return Err(TemplateError::UnmatchedClose {
                        template: template.to_owned(),
                        at,
                    });
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template {
            source: template.to_owned(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the template has no placeholders (every event goes to the same destination).
    pub fn is_static(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Literal(_)))
    }

    /// Renders the destination of `event`.
    ///
    /// ```
    /// # use postbox_sinks::Template;
    /// # fn event() -> postbox::OutboxEvent {
    /// #     let mut e = postbox::OutboxEvent::new(7, "InvoiceCreated", &serde_json::json!({})).unwrap();
    /// #     e.aggregate_type = Some("Invoice".into());
    /// #     e.aggregate_id = Some("456".into());
    /// #     e
    /// # }
    /// let template: Template = "billing.{aggregate_type}.{event_type}".parse().unwrap();
    /// assert_eq!(template.render(&event()).unwrap(), "billing.Invoice.InvoiceCreated");
    /// ```
    pub fn render(&self, event: &OutboxEvent) -> Result<String, RenderError> {
        self.render_with(event, |value, out| out.push_str(value))
    }

    /// Renders with `encode` writing each placeholder's value (e.g. percent-encoding for URLs).
    pub(crate) fn render_with(
        &self,
        event: &OutboxEvent,
        encode: impl Fn(&str, &mut String),
    ) -> Result<String, RenderError> {
        let mut out = String::with_capacity(self.source.len() + 32);
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Field(field) => {
                    let value = field.value(event).ok_or_else(|| RenderError {
                        event_id: event.id,
                        placeholder: field.name(),
                        template: self.source.clone(),
                    })?;
                    encode(&value, &mut out);
                }
            }
        }
        Ok(out)
    }
}

impl FromStr for Template {
    type Err = TemplateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Template::parse(s)
    }
}

impl TryFrom<String> for Template {
    type Error = TemplateError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Template::parse(&s)
    }
}

impl From<Template> for String {
    fn from(t: Template) -> Self {
        t.source
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Template({:?})", self.source)
    }
}

impl<'de> serde::Deserialize<'de> for Template {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Template::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for Template {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn event(aggregate: bool, tenant: Option<&str>) -> OutboxEvent {
        crate::test_event::event(7, aggregate, tenant)
    }

    #[test]
    fn renders_every_placeholder() {
        let t = Template::parse("{tenant}/{aggregate_type}/{aggregate_id}/{event_type}").unwrap();
        assert_eq!(
            t.render(&event(true, Some("acme"))).unwrap(),
            "acme/Invoice/456/InvoiceCreated"
        );
        assert!(!t.is_static());
        let s = Template::parse("fixed").unwrap();
        assert!(s.is_static());
        assert_eq!(s.render(&event(false, None)).unwrap(), "fixed");
    }

    #[test]
    fn literal_braces_are_escaped_by_doubling() {
        let t = Template::parse("{{x}}.{event_type}").unwrap();
        assert_eq!(t.render(&event(false, None)).unwrap(), "{x}.InvoiceCreated");
    }

    #[test]
    fn unknown_placeholder_is_refused_by_name() {
        let err = Template::parse("a.{aggregate}.b").unwrap_err();
        assert_eq!(
            err,
            TemplateError::UnknownPlaceholder {
                template: "a.{aggregate}.b".into(),
                name: "aggregate".into()
            }
        );
        assert!(err.to_string().contains("{aggregate}"), "{err}");
        let err = Template::parse("a.{}").unwrap_err();
        assert!(matches!(err, TemplateError::UnknownPlaceholder { .. }));
    }

    #[test]
    fn unbalanced_braces_and_empty_templates_are_refused() {
        assert_eq!(
            Template::parse("a.{event_type").unwrap_err(),
            TemplateError::Unclosed {
                template: "a.{event_type".into(),
                at: 2
            }
        );
        assert_eq!(
            Template::parse("a}b").unwrap_err(),
            TemplateError::UnmatchedClose {
                template: "a}b".into(),
                at: 1
            }
        );
        assert_eq!(Template::parse("").unwrap_err(), TemplateError::Empty);
    }

    #[test]
    fn a_missing_value_is_a_permanent_error_naming_it() {
        let t = Template::parse("x.{aggregate_type}").unwrap();
        let err = t.render(&event(false, None)).unwrap_err();
        assert_eq!(err.placeholder, "aggregate_type");
        let publish: PublishError = err.into();
        assert!(publish.is_permanent());
        assert!(publish.to_string().contains("aggregate_type"), "{publish}");
        let t = Template::parse("{tenant}").unwrap();
        assert!(t.render(&event(true, None)).is_err());
    }

    #[test]
    fn deserializes_from_a_string_and_refuses_bad_ones() {
        #[derive(serde::Deserialize)]
        struct C {
            topic: Template,
        }
        let c: C = serde_json::from_str(r#"{"topic":"a.{event_type}"}"#).unwrap();
        assert_eq!(c.topic.as_str(), "a.{event_type}");
        let err = serde_json::from_str::<C>(r#"{"topic":"a.{nope}"}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("{nope}"), "{err}");
    }

    #[test]
    fn render_with_encodes_values_only() {
        let t = Template::parse("/a b/{aggregate_id}").unwrap();
        let mut e = event(true, None);
        e.aggregate_id = Some("x y".into());
        let out = t
            .render_with(&e, |v, out| out.push_str(&v.replace(' ', "%20")))
            .unwrap();
        assert_eq!(out, "/a b/x%20y");
    }
}
