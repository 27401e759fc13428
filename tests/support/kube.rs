//! A real Kubernetes API server on loopback: `kube-apiserver`, built from Kubernetes' own Go
//! modules by `scripts/kube/build.sh` (run by `scripts/install-test-deps`), on an etcd of its
//! own, with a CA and serving certificate made with `openssl` (valid from a day ago), a static admin token, and a
//! kubeconfig for the tests' clients.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use incumbent::kubernetes::{k8s_openapi, kube};
use tempfile::TempDir;

use super::bin::find_binary;
use super::etcd::EtcdServer;
use super::net::free_addr;
use super::process::{Probe, ServerProcess, start_with_retries};
use super::tls::make_certificates_backdated;

/// How long the API server may take to serve the `default` namespace after it listens.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A `kube-apiserver` and its etcd, killed on drop.
pub struct KubeServer {
    process: ServerProcess,
    etcd: EtcdServer,
    addr: SocketAddr,
    kubeconfig: PathBuf,
    dir: TempDir,
}

impl KubeServer {
    /// Starts etcd and the API server (AlwaysAllow authorization; [`start_with_rbac`] for
    /// RBAC), and waits until the `default` namespace can be read.
    ///
    /// [`start_with_rbac`]: Self::start_with_rbac
    pub async fn start() -> Self {
        Self::start_with("AlwaysAllow").await
    }

    /// Like [`start`](Self::start), with RBAC on: the admin token is in `system:masters`;
    /// [`token_for`](Self::token_for) names other users.
    pub async fn start_with_rbac() -> Self {
        Self::start_with("RBAC").await
    }

    async fn start_with(authorization: &'static str) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let binary = find_binary("kube-apiserver");
        let etcd = EtcdServer::single_on_tmpfs().await;
        let dir = tempfile::Builder::new()
            .prefix("incumbent-kube-")
            .tempdir()
            .expect("temp dir");
        // Valid from a day ago: candidates under test may run with skewed clocks.
        make_certificates_backdated(dir.path());
        let tokens = "incumbent-admin-token,incumbent-admin,incumbent-admin,\"system:masters\"\n\
                      incumbent-user-token,incumbent-user,incumbent-user,\n";
        std::fs::write(dir.path().join("tokens.csv"), tokens).expect("write tokens");
        let etcd_url = etcd.endpoints()[0].clone();
        let (process, addr) = start_with_retries("kube-apiserver", || {
            let addr = free_addr();
            let args = args(dir.path(), addr, &etcd_url, authorization);
            let mut process = ServerProcess::spawn(
                "kube-apiserver",
                binary.clone(),
                args,
                dir.path(),
                Probe::Tcp { addr },
            );
            async move { process.try_wait_ready().await.map(|()| (process, addr)) }
        })
        .await;
        let kubeconfig = write_kubeconfig(dir.path(), addr, ADMIN_TOKEN);
        let server = KubeServer {
            process,
            etcd,
            addr,
            kubeconfig,
            dir,
        };
        server.wait_serving().await;
        server
    }

    /// Waits until the API server serves the `default` namespace (created by one of its own
    /// controllers shortly after it listens).
    pub async fn wait_serving(&self) {
        use k8s_openapi::api::core::v1::Namespace;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let answered = match kube::Client::try_from(self.config().await) {
                Ok(client) => kube::Api::<Namespace>::all(client)
                    .get("default")
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match answered {
                Ok(()) => return,
                Err(why) if tokio::time::Instant::now() >= deadline => panic!(
                    "kube-apiserver does not serve the default namespace after \
                     {READY_TIMEOUT:?}: {why}\n{}",
                    self.process.log_tail()
                ),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The kubeconfig of the admin user (namespace `default`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig for the user with `token` (from the token file: `incumbent-user-token`
    /// is a user with no rights unless RBAC grants some).
    pub fn kubeconfig_for(&self, token: &str) -> PathBuf {
        write_kubeconfig(self.dir.path(), self.addr, token)
    }

    /// A kubeconfig of the admin user that reaches the API server at `addr` (a proxy in
    /// front of it: the certificate names 127.0.0.1, so TLS passes through).
    pub fn kubeconfig_via(&self, addr: SocketAddr) -> PathBuf {
        write_kubeconfig(self.dir.path(), addr, ADMIN_TOKEN)
    }

    /// The admin's client configuration.
    pub async fn config(&self) -> kube::Config {
        config_from(&self.kubeconfig).await
    }

    /// The API server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API server's process (to restart, stop or kill it).
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// The etcd behind it.
    pub fn etcd(&mut self) -> &mut EtcdServer {
        &mut self.etcd
    }
}

/// The client configuration a kubeconfig file describes.
pub async fn config_from(path: &Path) -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("a config from the kubeconfig")
}

/// The admin user's token (in `system:masters`), from the token file.
const ADMIN_TOKEN: &str = "incumbent-admin-token";

/// Writes, into `dir`, a kubeconfig of the user with `token` at the API server `addr`.
fn write_kubeconfig(dir: &Path, addr: SocketAddr, token: &str) -> PathBuf {
    let path = dir.join(format!("kubeconfig-{}-{token}", addr.port()));
    std::fs::write(&path, kubeconfig_text(dir, addr, token)).expect("write kubeconfig");
    path
}

fn kubeconfig_text(dir: &Path, addr: SocketAddr, token: &str) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: incumbent\n  cluster:\n    server: https://{addr}\n    certificate-authority: {ca}\n\
         users:\n\
         - name: user\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: incumbent\n  context:\n    cluster: incumbent\n    user: user\n    namespace: default\n\
         current-context: incumbent\n",
        ca = dir.join("ca.pem").display()
    )
}

fn args(dir: &Path, addr: SocketAddr, etcd_url: &str, authorization: &str) -> Vec<String> {
    let file = |name: &str| dir.join(name).display().to_string();
    vec![
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={}", addr.port()),
        format!("--tls-cert-file={}", file("server.pem")),
        format!("--tls-private-key-file={}", file("server.key")),
        format!("--cert-dir={}", file("certs")),
        format!("--etcd-servers={etcd_url}"),
        "--etcd-prefix=/registry".into(),
        "--etcd-compaction-interval=0".into(),
        format!("--token-auth-file={}", file("tokens.csv")),
        "--anonymous-auth=false".into(),
        format!("--authorization-mode={authorization}"),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        // The serving key signs service-account tokens (the tests make none).
        format!("--service-account-key-file={}", file("server.pem")),
        format!("--service-account-signing-key-file={}", file("server.key")),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--endpoint-reconciler-type=none".into(),
        "--enable-priority-and-fairness=false".into(),
        "--profiling=false".into(),
        "--enable-admission-plugins=NamespaceLifecycle".into(),
        format!("--disable-admission-plugins={DISABLED_ADMISSION}"),
    ]
}

/// Every admission plugin on by default but `NamespaceLifecycle` (a Lease in a namespace
/// that does not exist is refused, as on a real cluster): the tests make Leases only.
const DISABLED_ADMISSION: &str = "LimitRanger,ServiceAccount,TaintNodesByCondition,PodSecurity,\
Priority,DefaultTolerationSeconds,DefaultStorageClass,StorageObjectInUseProtection,\
PersistentVolumeClaimResize,RuntimeClass,CertificateApproval,CertificateSigning,\
ClusterTrustBundleAttest,CertificateSubjectRestriction,DefaultIngressClass,\
MutatingAdmissionPolicy,MutatingAdmissionWebhook,ValidatingAdmissionPolicy,\
ValidatingAdmissionWebhook,ResourceQuota";
