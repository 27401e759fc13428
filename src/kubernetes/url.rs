//! Kubernetes' URL forms: `k8s://[namespace]` (the configuration inferred: the kubeconfig,
//! else the pod's service account; the namespace given, else the configuration's) and
//! `kubernetes:` (the pod's service account and its own namespace only). See
//! [`url`](crate::url).

use super::{KubernetesBackend, KubernetesBuilder, store::valid_label};
use crate::Result;
use crate::secret::{bad, split_url, wrong_scheme};

/// The forms, for messages.
pub(crate) const FORM: &str = "k8s://[namespace] or kubernetes:";

/// `k8s:…` or `kubernetes:…`, after the scheme: whether the configuration comes from the
/// pod only, and the namespace, if given.
pub(crate) fn parse(shown: &str, scheme: &str, rest: &str) -> Result<(bool, Option<String>)> {
    if rest.contains(['?', '#', '@']) {
        return Err(bad(format!(
            "{shown:?}: write {FORM} (no user, query string or fragment: credentials come \
             from the kubeconfig or the service account)"
        )));
    }
    if scheme == "kubernetes" {
        if !rest.is_empty() {
            return Err(bad(format!(
                "{shown:?}: kubernetes: takes nothing after the colon (the pod's own \
                 namespace); for another namespace write k8s://namespace"
            )));
        }
        return Ok((true, None));
    }
    let namespace = rest
        .strip_prefix("//")
        .unwrap_or(rest)
        .trim_end_matches('/');
    if namespace.is_empty() {
        return Ok((false, None));
    }
    if !valid_label(namespace) {
        return Err(bad(format!(
            "{shown:?}: {namespace:?} is not a namespace name (lowercase letters, digits \
             and '-', at most 63)"
        )));
    }
    Ok((false, Some(namespace.to_owned())))
}

impl KubernetesBackend {
    /// A builder for the cluster a URL names (`k8s://namespace`, `k8s://`, or
    /// `kubernetes:`): set more with the builder, then
    /// [`connect`](KubernetesBuilder::connect).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a URL of another form.
    pub fn from_url(url: &str) -> Result<KubernetesBuilder> {
        let (shown, scheme, rest) = split_url(url, FORM)?;
        if scheme != "k8s" && scheme != "kubernetes" {
            return Err(wrong_scheme(&shown, FORM));
        }
        let (in_cluster, namespace) = parse(&shown, scheme, rest)?;
        Ok(builder(in_cluster, namespace.as_deref()))
    }
}

/// The builder for these parts.
pub(crate) fn builder(in_cluster: bool, namespace: Option<&str>) -> KubernetesBuilder {
    let mut builder = KubernetesBackend::builder();
    if in_cluster {
        builder = builder.in_cluster();
    }
    if let Some(namespace) = namespace {
        builder = builder.namespace(namespace);
    }
    builder
}

#[cfg(test)]
mod tests {
    use crate::url::BackendUrl;

    #[test]
    fn the_forms_parse() {
        let parsed = |url: &str| url.parse::<BackendUrl>();
        assert_eq!(
            parsed("k8s://jobs").ok(),
            Some(BackendUrl::Kubernetes {
                in_cluster: false,
                namespace: Some("jobs".into())
            })
        );
        assert_eq!(
            parsed("k8s://").ok(),
            Some(BackendUrl::Kubernetes {
                in_cluster: false,
                namespace: None
            })
        );
        assert_eq!(
            parsed("kubernetes:").ok(),
            Some(BackendUrl::Kubernetes {
                in_cluster: true,
                namespace: None
            })
        );
        assert_eq!(
            parsed("k8s://jobs").expect("parsed").to_string(),
            "k8s://jobs"
        );
        assert_eq!(
            parsed("kubernetes:").expect("parsed").to_string(),
            "kubernetes:"
        );
        for (url, says) in [
            ("k8s://Jobs", "not a namespace name"),
            ("k8s://a_b", "not a namespace name"),
            ("k8s://user:secret@jobs", "user info"),
            ("k8s://jobs?x=1", "no user, query string"),
            ("kubernetes:jobs", "takes nothing after the colon"),
        ] {
            let error = parsed(url).expect_err(url).to_string();
            assert!(error.contains(says), "{url}: {error}");
            assert!(!error.contains("secret"), "{url}: {error}");
        }
    }
}
