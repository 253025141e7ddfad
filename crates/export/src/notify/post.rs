//! How notifications reach receivers: hyper's HTTP/1.1 client over rustls (ring), trusting
//! the system's roots plus `alerts.ca_file`, with the configured bearer token or basic auth,
//! each request bounded by `alerts.send_timeout`.

use std::time::Duration;

use base64::Engine;
use http::{HeaderValue, Request, StatusCode, header};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio_rustls::rustls;

use stormglass_runtime::health::error_chain;

use super::config::{NotifyConfig, NotifyError};

/// Posts JSON documents to receivers. Cheap to clone.
#[derive(Clone)]
pub struct Poster {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<bytes::Bytes>>,
    timeout: Duration,
    authorization: Option<HeaderValue>,
}

/// Why a post failed.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("answered {0}")]
    Status(StatusCode),
    #[error("{0}")]
    Transport(String),
    #[error("no answer within alerts.send_timeout")]
    Timeout,
}

impl PostError {
    /// A failure worth retrying: no answer, or an answer that says to come back.
    pub fn may_pass(&self) -> bool {
        match self {
            PostError::Status(status) => status.is_server_error() || status.as_u16() == 429,
            PostError::Transport(_) | PostError::Timeout => true,
        }
    }
}

impl Poster {
    pub fn new(config: &NotifyConfig) -> Result<Poster, NotifyError> {
        let mut roots = rustls::RootCertStore::empty();
        // Unreadable system certificates are skipped; receivers they would have signed fail
        // their handshake, and say so.
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        if let Some(path) = &config.ca_file {
            let certificates = stormglass_runtime::tls::read_certificates(path)
                .map_err(|e| NotifyError::Tls(e.to_string()))?;
            for certificate in certificates {
                roots
                    .add(certificate)
                    .map_err(|e| NotifyError::Tls(format!("{}: {e}", path.display())))?;
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| NotifyError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let authorization = match (&config.bearer_token, &config.basic_auth) {
            (Some(token), _) => Some(format!("Bearer {}", token.expose())),
            (None, Some(basic)) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!(
                    "{}:{}",
                    basic.username,
                    basic.password.expose()
                ))
            )),
            (None, None) => None,
        };
        let authorization = authorization
            .map(|value| {
                let mut value =
                    HeaderValue::try_from(value).map_err(|_| NotifyError::Credentials)?;
                value.set_sensitive(true);
                Ok::<_, NotifyError>(value)
            })
            .transpose()?;
        Ok(Poster {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout: config.send_timeout,
            authorization,
        })
    }

    /// POST `body` (JSON) to `url`; a non-2xx answer is an error.
    pub async fn post_json(&self, url: &str, body: bytes::Bytes) -> Result<(), PostError> {
        let mut request = Request::post(url).header(header::CONTENT_TYPE, "application/json");
        if let Some(authorization) = &self.authorization {
            request = request.header(header::AUTHORIZATION, authorization.clone());
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| PostError::Transport(e.to_string()))?;
        let response = tokio::time::timeout(self.timeout, self.client.request(request))
            .await
            .map_err(|_| PostError::Timeout)?
            .map_err(|e| PostError::Transport(error_chain(&e)))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(PostError::Status(response.status()))
        }
    }
}
