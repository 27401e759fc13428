//! TLS material for the etcd connection, and how it is handed to `etcd-client`.
//!
//! TLS needs `etcd-client`'s `tls` feature (rustls with ring), which incumbent turns on only
//! with its own `etcd-tls` feature. Without it, asking for TLS is a configuration error that
//! says which feature to enable.
// `etcd-tls` is declared in Cargo.toml; the allowance covers builds of a manifest without it.

use std::fmt;

use etcd_client::ConnectOptions;

use super::NAME;
use crate::{Error, Result};

/// Certificates for an `https://` connection. The private key never appears in `Debug` output.
#[derive(Clone, Default)]
pub(super) struct TlsMaterial {
    /// PEM of the CA that signed the servers' certificates.
    pub ca: Option<Vec<u8>>,
    /// PEM of the client certificate and its private key, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify in the servers' certificates, instead of the endpoint's host.
    pub domain: Option<String>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca", &self.ca.as_ref().map(|_| "<pem>"))
            .field(
                "client_identity",
                &self.identity.as_ref().map(|_| "<redacted>"),
            )
            .field("domain", &self.domain)
            .finish()
    }
}

impl TlsMaterial {
    /// Checks that the material is PEM of the right kinds, so that a mistake is reported now
    /// as a configuration error rather than later as an unreachable store.
    pub fn validate(&self) -> Result<()> {
        let Some(ca) = &self.ca else {
            return Err(invalid(
                "TLS needs the CA certificate that signed the etcd servers' certificates; \
                 call .ca_certificate(pem)"
                    .into(),
            ));
        };
        if !contains(ca, b"-----BEGIN CERTIFICATE-----") {
            return Err(invalid(
                "the CA certificate is not PEM (no \"-----BEGIN CERTIFICATE-----\"); \
                 pass the contents of the CA's .pem/.crt file"
                    .into(),
            ));
        }
        if let Some((cert, key)) = &self.identity {
            if !contains(cert, b"-----BEGIN CERTIFICATE-----") {
                return Err(invalid(
                    "the client certificate is not PEM (no \"-----BEGIN CERTIFICATE-----\"); \
                     pass the contents of the client's .pem/.crt file"
                        .into(),
                ));
            }
            if !contains(key, b"PRIVATE KEY-----") {
                return Err(invalid(
                    "the client key is not a PEM private key (no \"PRIVATE KEY-----\"); \
                     pass the contents of the client's key file"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Adds the material to `etcd-client`'s options.
    #[cfg(feature = "etcd-tls")]
    pub fn apply(&self, options: ConnectOptions) -> Result<ConnectOptions> {
        use etcd_client::{Certificate, Identity, TlsOptions};

        self.validate()?;
        let mut tls = TlsOptions::new();
        if let Some(ca) = &self.ca {
            tls = tls.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        Ok(options.with_tls(tls))
    }

    /// Without the `etcd-tls` feature there is no TLS: says which feature to enable.
    #[cfg(not(feature = "etcd-tls"))]
    pub fn apply(&self, _options: ConnectOptions) -> Result<ConnectOptions> {
        self.validate()?;
        Err(invalid(FEATURE_NEEDED.into()))
    }
}

/// Whether this build can speak TLS to etcd.
pub(super) const SUPPORTED: bool = cfg!(feature = "etcd-tls");

/// What to do when TLS is asked for in a build without it.
pub(super) const FEATURE_NEEDED: &str = "TLS (https:// endpoints, certificates) needs incumbent's \
     `etcd-tls` cargo feature; enable it: incumbent = { features = [\"etcd-tls\"] }";

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn invalid(reason: String) -> Error {
    Error::InvalidConfig {
        backend: NAME,
        reason,
    }
}
