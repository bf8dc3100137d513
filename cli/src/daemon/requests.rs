//! What clients ask of the runtime loop, prepared on the client's own task: URIs
//! parsed, host names resolved, a reload's config read again, so that a slow resolver
//! or file never stalls the loop.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use weft_control::Request;
use weft_datapath::transport::Endpoint;
use weft_peers::NodeId;
use weft_peers::node::PeerRef;

use crate::config::NodeConfig;
use crate::config::args::UpArgs;
use crate::config::values::PeerUri;
use crate::control::server::Prepare;

/// What a client asks of the control loop.
pub(crate) enum Ask {
    Status,
    AddPeer(Endpoint, PeerUri),
    RemovePeer(PeerRef),
    Portal(PortalAsk),
    Reload(Box<Reloaded>),
    AcceptExit,
    Revoke(Box<weft_core::cert::Revocation>),
    Explain { from: String, to: String, proto: String },
    PushPolicy(Vec<u8>),
}

/// A change to the WireGuard portal's clients (served on a blocking thread: the
/// client store is written and fsynced).
pub(crate) enum PortalAsk {
    Add(String),
    Remove(String),
}

/// Turns a request into an [`Ask`]: parses URIs and node ids and resolves host names
/// (at most 5 s), or says what is wrong with them.
#[derive(Clone)]
pub(crate) struct Asker {
    /// The flags `weft up` was given (a reload reads the file again under them).
    pub(crate) args: Arc<UpArgs>,
}

impl Prepare for Asker {
    type Ask = Ask;
    async fn prepare(&self, req: Request) -> Result<Ask, String> {
        ask(req, &self.args).await
    }
}

async fn ask(req: Request, args: &Arc<UpArgs>) -> Result<Ask, String> {
    let resolve = |u: PeerUri| async move {
        let job = tokio::task::spawn_blocking(move || u.resolve().map(|e| (e, u)));
        match tokio::time::timeout(Duration::from_secs(5), job).await {
            Ok(Ok(r)) => r.map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(format!("cannot resolve: {e}")),
            Err(_) => Err("name resolution took longer than 5 s".to_owned()),
        }
    };
    match req {
        Request::Status => Ok(Ask::Status),
        Request::AddPeer { uri } => {
            let u = uri.parse::<PeerUri>().map_err(|e| e.to_string())?;
            let (to, u) = resolve(u).await?;
            Ok(Ask::AddPeer(to, u))
        }
        Request::RemovePeer { peer } => {
            if let Ok(id) = peer.parse::<NodeId>() {
                return Ok(Ask::RemovePeer(PeerRef::Node(id)));
            }
            let u = peer.parse::<PeerUri>().map_err(|e| format!("{e} (or give a node id: 16 hex digits)"))?;
            Ok(Ask::RemovePeer(PeerRef::Endpoint(resolve(u).await?.0)))
        }
        Request::WgAdd { name } => Ok(Ask::Portal(PortalAsk::Add(name))),
        Request::WgRemove { name } => Ok(Ask::Portal(PortalAsk::Remove(name))),
        Request::Reload => Ok(Ask::Reload(Box::new(load_again(args.clone()).await?))),
        Request::AcceptExit => Ok(Ask::AcceptExit),
        Request::ExplainPolicy { from, to, proto } => Ok(Ask::Explain { from, to, proto }),
        Request::PushPolicy { policy } => weft_core::policy::SignedPolicy::from_text(&policy)
            .map(|p| Ask::PushPolicy(p.to_bytes()))
            .map_err(|e| format!("invalid signed policy: {e}")),
        Request::AddRevocation { revocation } => weft_core::cert::Revocation::from_text(&revocation)
            .map(|r| Ask::Revoke(Box::new(r)))
            .map_err(|e| format!("invalid revocation: {e}")),
    }
}

/// The config read again for a reload, with its peers resolved (off the control loop).
pub(super) struct Reloaded {
    /// The config.
    pub(super) cfg: NodeConfig,
    /// Its peers, resolved.
    pub(super) peers: Vec<(PeerUri, Endpoint)>,
    /// The PSKs of its network secret and next secret (Argon2id, off the loop).
    pub(super) psks: (weft_core::handshake::Psk, Option<weft_core::handshake::Psk>),
}

/// Reads the config file again with the flags `weft up` was given, and resolves its
/// peers: at most 10 s, on a blocking thread.
pub(crate) async fn load_again(args: Arc<UpArgs>) -> Result<Reloaded, String> {
    if args.config.is_none() {
        return Err("nothing to reload: this node was started without --config".into());
    }
    let job = tokio::task::spawn_blocking(move || {
        let cfg = NodeConfig::resolve(&args).map_err(|e| e.to_string())?;
        let peers = cfg
            .peers
            .iter()
            .map(|p| p.resolve().map(|e| (p.clone(), e)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let psks = super::psks(&cfg);
        Ok(Reloaded { cfg, peers, psks })
    });
    match tokio::time::timeout(Duration::from_secs(10), job).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(format!("cannot reload: {e}")),
        Err(_) => Err("reading the config and resolving its peers took longer than 10 s".into()),
    }
}
