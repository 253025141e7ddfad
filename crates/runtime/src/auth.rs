//! Bearer tokens: `auth.token` for the receivers (both transports), `auth.api_token` for the
//! API. A request passes when it carries `authorization: Bearer <token>` (the scheme's case
//! ignored), compared in constant time; with no token configured, every request passes.

use std::sync::Arc;

use http::HeaderValue;
use serde::Deserialize;
use subtle::ConstantTimeEq;

/// A secret from the configuration: never printed, not even in debug logs.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "<redacted>"
        })
    }
}

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// `auth.*` configuration.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Bearer token the OTLP receivers require; none when unset or empty.
    pub token: Option<Secret>,
    /// Bearer token the API requires (`/metrics`, `/api/...`; not `/healthz`, `/readyz`).
    pub api_token: Option<Secret>,
}

/// A required bearer token. Cheap to clone.
#[derive(Clone)]
pub struct BearerToken(Arc<[u8]>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl BearerToken {
    /// The token to require, or `None` when `secret` is unset or empty.
    pub fn new(secret: Option<&Secret>) -> Option<BearerToken> {
        secret
            .filter(|s| !s.0.is_empty())
            .map(|s| BearerToken(s.0.as_bytes().into()))
    }

    /// True when `authorization` is `Bearer <this token>`.
    pub fn admits(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(value) = authorization.map(HeaderValue::as_bytes) else {
            return false;
        };
        let Some((scheme, presented)) = value.split_at_checked(7) else {
            return false;
        };
        scheme.eq_ignore_ascii_case(b"bearer ") && bool::from(presented.ct_eq(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only `Bearer <token>` passes (any case of the scheme); empty configuration means no
    /// token; secrets never show in debug output.
    #[test]
    fn bearer_tokens() {
        let token = BearerToken::new(Some(&Secret::new("s3cret"))).unwrap();
        let header = |v: &'static str| HeaderValue::from_static(v);
        assert!(token.admits(Some(&header("Bearer s3cret"))));
        assert!(token.admits(Some(&header("bearer s3cret"))));
        assert!(!token.admits(Some(&header("Bearer s3cre"))));
        assert!(!token.admits(Some(&header("Bearer s3cret2"))));
        assert!(!token.admits(Some(&header("Basic s3cret"))));
        assert!(!token.admits(Some(&header("s3cret"))));
        assert!(!token.admits(None));
        assert!(BearerToken::new(Some(&Secret::new(""))).is_none());
        assert!(BearerToken::new(None).is_none());
        let config = AuthConfig {
            token: Some(Secret::new("s3cret")),
            api_token: None,
        };
        assert!(!format!("{config:?}").contains("s3cret"));
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
