//! The command line (clap). These spellings are a stable interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Default control socket of a node run by root.
pub const DEFAULT_CONTROL: &str = "/run/weft/weft.sock";

/// Default state directory of a node run by root.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/weft";

/// The default control socket: [`DEFAULT_CONTROL`] for root, else
/// `$XDG_RUNTIME_DIR/weft/weft.sock` (or `/tmp/weft-UID/weft.sock` without it), so an
/// unprivileged node (`--no-tun`) and the commands that ask it agree without flags.
pub fn default_control() -> PathBuf {
    if crate::control::access::is_root() {
        return DEFAULT_CONTROL.into();
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("weft/weft.sock"),
        None => fallback_dir().join("weft.sock"),
    }
}

/// Where a non-root node without `XDG_RUNTIME_DIR` (or `HOME`) keeps its socket and
/// state: `/tmp/weft-UID`. Anyone may create that name first in `/tmp`, so a node
/// uses it only if it is a directory of its own, mode 0700 (`daemon::state::private_dir` checks it).
pub fn fallback_dir() -> PathBuf {
    PathBuf::from(format!("/tmp/weft-{}", crate::control::access::own_uid()))
}

/// The default state directory: [`DEFAULT_STATE_DIR`] for root, else
/// `$XDG_STATE_HOME/weft` (or `~/.local/state/weft`).
pub fn default_state_dir() -> PathBuf {
    if crate::control::access::is_root() {
        return DEFAULT_STATE_DIR.into();
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("weft");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => PathBuf::from(h).join(".local/state/weft"),
        None => fallback_dir().join("state"),
    }
}

/// What `weft --version` prints after the name: the release, the git commit it was
/// built from (`unknown` outside a git checkout; see `build.rs`) and the protocol
/// version it speaks (`weft_core::handshake::Protocol::VERSION`; a test checks the
/// two agree).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("WEFT_GIT_COMMIT"), ") protocol 3");

/// The git commit this build was made from.
pub const COMMIT: &str = env!("WEFT_GIT_COMMIT");

/// Weft: a peer-to-peer mesh VPN node.
#[derive(Debug, Parser)]
#[command(name = "weft", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax, e.g. `info` or `weft=debug`); RUST_LOG also
    /// works, and `log-level` in the config file of `weft up` (flag and environment win).
    #[arg(long, global = true, env = "WEFT_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Log format on standard error: `text` (default) or `json` (one JSON object per
    /// line, for log shippers); also `log-format` in the config file of `weft up`.
    #[arg(long, global = true, env = "WEFT_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a node and join a network.
    Up(Box<UpArgs>),
    /// Show this node, its peers and their sessions.
    Status(QueryArgs),
    /// Show every peer: path (direct or relayed), latency, loss, traffic.
    Peers(QueryArgs),
    /// Show the route to every member of the mesh.
    Routes(QueryArgs),
    /// Show what this node's NAT does, as the members it links to see it: mapping
    /// behaviour (endpoint-independent or dependent, port preserving), the router's
    /// port mapping, the candidate endpoints other members try, and for each relayed
    /// member why there is no direct path.
    Netcheck(QueryArgs),
    /// Add or remove a peer of a running node (root or the weft-admin group only;
    /// reading the status needs only the weft group).
    #[command(subcommand)]
    Peer(PeerCommand),
    /// Re-read the running node's config file and apply what can change live: peers,
    /// listeners of every transport, proxied subnets, LAN discovery, Magic DNS, metrics address, log
    /// level. Sessions stay up; what needs a restart is named and left as it was. SIGHUP
    /// does the same (`systemctl reload weft`). Root or the weft-admin group only.
    Reload(ControlArgs),
    /// The exit node this node uses (`--use-exit-node`): `accept` moves it to the
    /// member the name matches now, when the member it was pinned to is gone (root or
    /// the weft-admin group only).
    #[command(subcommand)]
    Exit(ExitCommand),
    /// Manage the clients of this node's WireGuard portal (`--wg-portal`): add and
    /// remove need root or the weft-admin group.
    #[command(subcommand)]
    Wg(WgCommand),
    /// Make network secrets.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// A network's authority: its key, member certificates and revocations (the
    /// authority's key stays with the admin, off the nodes).
    #[command(subcommand)]
    Authority(AuthorityCommand),
    /// Print this node's id: the static public key its handshakes prove, which
    /// certificates name (`weft authority sign --node-id`). Makes the node key when
    /// there is none yet, as `weft up` would.
    Id(IdArgs),
    /// Read member certificates.
    #[command(subcommand)]
    Cert(CertCommand),
    /// Hand a revocation (`weft authority revoke`) to a running node, which passes it
    /// to every member: the revoked member's sessions close everywhere and it is
    /// refused from then on (root or the weft-admin group only).
    #[command(subcommand)]
    Revoke(RevokeCommand),
    /// Access policy between members: check a policy file, ask a running node which
    /// rule decides a flow.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Serve the web console of a running node: members, mesh map and live traffic,
    /// access policy, invites and revocations. Prints the address to open, with a
    /// login token; it talks to the node over the control socket with the rights of
    /// the user who runs it. Actions that need the authority's key are offered only
    /// with --authority-key, which stays in this process.
    Web(Box<WebArgs>),
    /// Print the release, the commit and the protocol version (what `--version` says;
    /// `--json` for scripts, with the oldest protocol this build talks to).
    Version(VersionArgs),
    /// Print a shell completion script to stdout.
    Completions(CompletionsArgs),
    /// Print a man page (roff) to stdout, for packaging.
    #[command(hide = true)]
    Man(ManArgs),
}

/// `weft up`. Every value may also come from the config file; flags win, then
/// environment, then the file, then defaults.
#[derive(Debug, Args, Default)]
pub struct UpArgs {
    /// TOML config file with the same keys as the flags (kebab-case).
    #[arg(long, value_name = "FILE", env = "WEFT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Name of the network to join.
    #[arg(long, value_name = "NAME")]
    pub network_name: Option<String>,
    /// Shared secret of the network (prefer WEFT_NETWORK_SECRET or the config file, which
    /// stay out of `ps`). Make one with `weft secret generate`: a weak secret (below
    /// about 60 bits, estimated at start) is warned about, since anyone who records one
    /// handshake can guess it offline.
    #[arg(long, value_name = "SECRET", env = "WEFT_NETWORK_SECRET", hide_env_values = true)]
    pub network_secret: Option<crate::config::values::Secret>,
    /// The network's next secret, accepted beside the current one while the secret
    /// rotates (and used with every member that has it too); changes live on reload.
    /// Once every member's peers show `secret: next`, make it the network secret.
    #[arg(long, value_name = "SECRET", env = "WEFT_NETWORK_SECRET_NEXT", hide_env_values = true)]
    pub network_secret_next: Option<crate::config::values::Secret>,
    /// Overlay address of this node, with the network's prefix length.
    #[arg(short = 'i', long, value_name = "ADDR/PREFIX")]
    pub ipv4: Option<String>,
    /// Pick a free overlay address in 10.126.126.0/24, moving on a conflict.
    #[arg(long, conflicts_with = "ipv4")]
    pub dhcp: bool,
    /// IPv6 overlay address with the network's prefix length (default: one derived
    /// from the network name and the node id, fdXX:XXXX:XXXX::NODE-ID/64, the same
    /// /64 on every member).
    #[arg(long, value_name = "ADDR/PREFIX", conflicts_with = "no_ipv6")]
    pub ipv6: Option<String>,
    /// An IPv4-only overlay: no IPv6 address on the TUN, no IPv6 routes.
    #[arg(long)]
    pub no_ipv6: bool,
    /// Listener URI, repeatable: udp://, tcp://, quic://, ws://, wss:// (default: udp
    /// and tcp on 11010, ws on 11011, quic and wss on 11012, all addresses).
    #[arg(short = 'l', long = "listen", value_name = "URI")]
    pub listen: Vec<String>,
    /// TLS certificate (PEM) for wss:// and quic:// listeners (default: a self-signed
    /// one in the state directory; peers authenticate by the Noise handshake, not TLS).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Connections each tcp/ws/wss/quic listener accepts at most (default 256); one
    /// source address (IPv6: one /48) gets at most a quarter of them, 8 at most.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Peer to dial and keep connected; repeatable.
    #[arg(short = 'p', long = "peer", value_name = "URI")]
    pub peer: Vec<String>,
    /// Data cipher: aes-128-gcm (default), chacha20-poly1305, or none (authenticated but
    /// not encrypted: every packet still carries a tag keyed by its session).
    #[arg(long, value_name = "CIPHER")]
    pub cipher: Option<String>,
    /// Forwarding pipelines (thread pairs); default one per core.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// TUN device name (default weft0).
    #[arg(long, value_name = "NAME")]
    pub dev_name: Option<String>,
    /// Inner MTU of the TUN device (default 1420).
    #[arg(long, value_name = "N")]
    pub mtu: Option<u16>,
    /// Control socket path (default /run/weft/weft.sock for root, else
    /// $XDG_RUNTIME_DIR/weft/weft.sock).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Group whose members may change the running node through the control socket
    /// (`weft peer add|remove`; default weft-admin); root always may. Reading the
    /// status needs only access to the socket (mode 0660, the weft group under systemd).
    #[arg(long, value_name = "GROUP")]
    pub admin_group: Option<String>,
    /// State directory holding the node key (default /var/lib/weft for root, else
    /// $XDG_STATE_HOME/weft or ~/.local/state/weft).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Host name announced to peers (default: the system host name; with a
    /// certificate, the name it grants).
    #[arg(long, value_name = "NAME")]
    pub hostname: Option<String>,
    /// The network's authority (`weft authority init` prints it): only members with a
    /// certificate it signed are admitted. Repeat during a rollover to trust two.
    #[arg(long = "authority", value_name = "PUBKEY")]
    pub authorities: Vec<String>,
    /// This node's member certificate (`weft authority sign`), or a file holding it:
    /// its addresses and host name become this node's defaults, and nothing else.
    #[arg(long, value_name = "CERT|FILE")]
    pub certificate: Option<String>,
    /// Join with an invite (`weft authority invite`): the token gives the network
    /// name, secret, entry points and authority; an issuer gives this node its
    /// certificate, kept in the state directory for the next start.
    #[arg(long, value_name = "TOKEN", env = "WEFT_JOIN", hide_env_values = true)]
    pub join: Option<String>,
    /// An access policy file (TOML; `weft policy check` tests it): once given, this
    /// node takes only the flows it allows, and their answers (changes on reload).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The authority's private key file: this member issues certificates to machines
    /// that join with an invite (keep the key on as few members as possible).
    #[arg(long, value_name = "FILE")]
    pub authority_key: Option<PathBuf>,
    /// Turn every offload off (TUN TSO/GRO, UDP GSO, UDP GRO).
    #[arg(long, env = "WEFT_NO_OFFLOAD", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_offload: bool,
    /// Turn TUN offload (TSO/GRO through virtio-net headers) off.
    #[arg(long, env = "WEFT_NO_TUN_OFFLOAD", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_tun_offload: bool,
    /// Turn UDP GSO (UDP_SEGMENT) on send off.
    #[arg(long, env = "WEFT_NO_UDP_GSO", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_udp_gso: bool,
    /// Turn UDP GRO on receive off.
    #[arg(long, env = "WEFT_NO_UDP_GRO", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_udp_gro: bool,
    /// Pin each pipeline's threads to one core (off by default: on small machines the
    /// scheduler spreads TX, RX and the applications better; see bench/RESULTS.md).
    #[arg(long, env = "WEFT_PIN", value_parser = clap::builder::FalseyValueParser::new())]
    pub pin: bool,
    /// Advertise a subnet behind this node to the mesh and forward for it; repeatable.
    /// What members send into it leaves with this node's own address as its source
    /// (nftables table weft-snat-DEV), so the subnet's hosts need no route back.
    #[arg(long = "proxy-network", value_name = "CIDR")]
    pub proxy_network: Vec<String>,
    /// Keep members' overlay addresses as the source of what they send into the
    /// --proxy-network subnets (the subnet's router must then route the overlay back
    /// to this node).
    #[arg(long)]
    pub no_snat_subnet_routes: bool,
    /// This node's preference as a router of its --proxy-network subnets when other
    /// members proxy the same subnet (a network with an authority whose certificates
    /// grant it to several): every member sends the subnet's traffic to the reachable
    /// router with the highest priority (then the lowest node id), and moves to the
    /// next within 2 s of losing it. 0-255, default 100.
    #[arg(long, value_name = "N")]
    pub router_priority: Option<u8>,
    /// Check this target on the --proxy-network side every second: ADDR pings it
    /// (ICMP), ADDR:PORT or tcp://ADDR:PORT opens a TCP connection. After 3 failures
    /// in a row the subnets are withdrawn from the mesh (members move to another
    /// router) until 2 checks in a row pass.
    #[arg(long, value_name = "ADDR|ADDR:PORT")]
    pub proxy_health: Option<String>,
    /// Find members on the same link by multicast beacons (they carry only a hash of
    /// the network name); no --peer needed.
    #[arg(long)]
    pub lan_discovery: bool,
    /// Do not ask the router (PCP, NAT-PMP, UPnP-IGD) to forward a port to this
    /// node's UDP port; with it on (the default) the mapped address is announced to
    /// members, so they reach this node directly through NATs hole punching cannot
    /// cross.
    #[arg(long)]
    pub no_port_mapping: bool,
    /// Prefer the path with the lowest latency over the one with the fewest hops.
    #[arg(long)]
    pub latency_first: bool,
    /// Route subnets other members proxy even when shorter than /8 (e.g. a member
    /// that is an exit to the internet announcing 0.0.0.0/1 and 128.0.0.0/1);
    /// without it such subnets are refused.
    #[arg(long)]
    pub accept_wide_subnets: bool,
    /// Serve stock WireGuard clients (phones, routers, the official apps) on this UDP
    /// address, e.g. udp://0.0.0.0:51820; add them with `weft wg add NAME`. Needs
    /// --wg-portal-net.
    #[arg(long, value_name = "URI")]
    pub wg_portal: Option<String>,
    /// The addresses the portal gives its clients, e.g. 10.127.0.0/24 (the portal has
    /// the first host); the mesh routes it to this node like a proxied subnet.
    #[arg(long, value_name = "CIDR")]
    pub wg_portal_net: Option<String>,
    /// HOST:PORT written as the Endpoint of client configs (default: the --wg-portal
    /// address, or this host's first address when it listens on all).
    #[arg(long, value_name = "HOST:PORT")]
    pub wg_portal_endpoint: Option<String>,
    /// Serve Prometheus metrics (text format) at http://ADDR:PORT/metrics, e.g.
    /// 127.0.0.1:9108 or the overlay address; off by default. The numbers are those of
    /// `weft status --json`; anyone who can reach the address can read them.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// Offer this node as the mesh's way to the internet: members that choose it
    /// (--use-exit-node) send their default route here, and it forwards and
    /// masquerades their traffic (nftables table weft-exit-DEV, removed when it stops).
    #[arg(long, conflicts_with = "use_exit_node")]
    pub exit_node: bool,
    /// With --exit-node: also forward members' connections to private, link-local
    /// and CGNAT addresses and to the networks this host is connected to (its LAN,
    /// docker and libvirt bridges, cloud metadata at 169.254.169.254). Off by default:
    /// an exit gives members the internet, not its own neighbourhood.
    #[arg(long)]
    pub exit_allow_lan: bool,
    /// Send this host's default route through the member NAME (host name) or ID (node
    /// id, or its first 6+ hex digits), which runs --exit-node. Weft's own traffic stays
    /// on the underlay (firewall mark and routing table 30566, as wg-quick does); IPv6
    /// goes through the exit too (::/0), or is blocked without an IPv6 overlay. Several,
    /// comma-separated (NAME,NAME,...), are used in that order of preference, and
    /// `auto` uses the nearest member offering an exit this node may use: when the exit
    /// in use is lost, traffic moves to the next within 2 s.
    #[arg(long, value_name = "NAME|ID[,...]|auto")]
    pub use_exit_node: Option<String>,
    /// While the exit node is unreachable, let traffic out by this host's own default
    /// route instead of dropping it (without this, it fails closed).
    #[arg(long)]
    pub exit_fallback: bool,
    /// Do not answer DNS for the members' names on the overlay address (Magic DNS is on
    /// by default: `<host>.<domain>` for every member, everything else refused).
    #[arg(long)]
    pub no_magic_dns: bool,
    /// The Magic DNS domain (default: the network name under `internal`, e.g.
    /// `office.internal`).
    #[arg(long, value_name = "DOMAIN")]
    pub dns_domain: Option<String>,
    /// Register Magic DNS with systemd-resolved (resolvectl) for its domain only, on
    /// the TUN device; undone when the node stops.
    #[arg(long)]
    pub accept_dns: bool,
    /// Run without a TUN device, root or any capability: a userspace TCP/IP stack
    /// answers pings and serves --expose ports on the overlay addresses, and local
    /// programs reach the mesh through --socks5 and --forward. No kernel routes, no
    /// `ip` commands; TUN-only settings (--dev-name, --proxy-network, --exit-node,
    /// --use-exit-node, --wg-portal, --accept-dns, offloads, --threads) are refused.
    #[arg(long)]
    pub no_tun: bool,
    /// Serve SOCKS5 (CONNECT and UDP ASSOCIATE) on this address, e.g. 127.0.0.1:1080:
    /// destinations are members' overlay addresses, their proxied subnets, and member
    /// names under the Magic DNS domain. Needs --no-tun.
    #[arg(long, value_name = "ADDR:PORT")]
    pub socks5: Option<String>,
    /// Require this USER:PASSWORD of SOCKS5 clients (RFC 1929); prefer the environment
    /// or the config file, which stay out of `ps`.
    #[arg(long, value_name = "USER:PASSWORD", env = "WEFT_SOCKS5_AUTH", hide_env_values = true)]
    pub socks5_auth: Option<crate::config::values::Secret>,
    /// Forward a local port to a member's port, repeatable:
    /// `tcp://127.0.0.1:8080=10.126.0.2:80` or `udp://[::1]:5353=alpha.office.internal:53`.
    /// Needs --no-tun.
    #[arg(long = "forward", value_name = "PROTO://LOCAL=REMOTE:PORT")]
    pub forward: Vec<String>,
    /// Expose a local service on this node's overlay port, repeatable:
    /// tcp://80=127.0.0.1:8080 (members connecting to our port 80 reach
    /// 127.0.0.1:8080). Needs --no-tun.
    #[arg(long = "expose", value_name = "PROTO://PORT=LOCAL:PORT")]
    pub expose: Vec<String>,
    /// Rekey interval in seconds (default 120); for testing.
    #[arg(long, value_name = "SECS", hide = true)]
    pub rekey_after: Option<u64>,
}

/// Options of the query commands.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Control socket of the node to ask.
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL", default_value_os_t = default_control())]
    pub control: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of commands that only need the control socket.
#[derive(Debug, Args)]
pub struct ControlArgs {
    /// Control socket of the node.
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL", default_value_os_t = default_control())]
    pub control: PathBuf,
}

/// `weft peer`.
#[derive(Debug, Subcommand)]
pub enum PeerCommand {
    /// Dial a peer and keep it connected (until removed or the node restarts).
    Add(PeerArgs),
    /// Stop dialling a peer and close its sessions.
    Remove(PeerArgs),
}

/// Arguments of `weft peer add|remove`.
#[derive(Debug, Args)]
pub struct PeerArgs {
    /// Peer URI (e.g. udp://198.51.100.7:11010); for remove also a node id.
    #[arg(value_name = "PEER")]
    pub peer: String,
    /// Control socket of the node.
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL", default_value_os_t = default_control())]
    pub control: PathBuf,
}

/// `weft exit`.
#[derive(Debug, Subcommand)]
pub enum ExitCommand {
    /// Use the member `--use-exit-node` matches now. The exit is pinned to the member
    /// the name first matched; when another member matches instead (the old exit was
    /// reinstalled with a new key, or someone copied its name), traffic fails closed
    /// until this is run. Naming the exit by node id avoids the question.
    Accept(ControlArgs),
}

/// `weft wg`.
#[derive(Debug, Subcommand)]
pub enum WgCommand {
    /// Add a client: prints its wg-quick config (with a new private key, shown once:
    /// the node does not keep it) for `wg-quick up` or a WireGuard app.
    Add(WgAddArgs),
    /// List the clients: address, endpoint, last handshake, traffic.
    List(QueryArgs),
    /// Remove a client: its key gets nothing through any more.
    Remove(WgNameArgs),
}

/// Arguments of `weft wg add`.
#[derive(Debug, Args)]
pub struct WgAddArgs {
    /// Client name: 1 to 32 letters, digits, '.', '_' or '-'.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Also print the config as a QR code (for the phone apps' "scan from QR code").
    #[arg(long)]
    pub qr: bool,
    /// Print JSON (name, address, public key, endpoint, config).
    #[arg(long, conflicts_with = "qr")]
    pub json: bool,
    /// Control socket of the node.
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL", default_value_os_t = default_control())]
    pub control: PathBuf,
}

/// Arguments of `weft wg remove`.
#[derive(Debug, Args)]
pub struct WgNameArgs {
    /// Client name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Control socket of the node.
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL", default_value_os_t = default_control())]
    pub control: PathBuf,
}

/// `weft secret`.
#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Print a new random network secret (256 bits from the OS random generator,
    /// base64url, 43 characters) on stdout, once; give it to every member through
    /// the config file or WEFT_NETWORK_SECRET. A weak secret (below about 60 bits by
    /// `weft up`'s estimate) can be guessed offline by anyone who records one handshake.
    Generate,
}

/// `weft authority`.
#[derive(Debug, Subcommand)]
pub enum AuthorityCommand {
    /// Make an authority key pair: writes the private key to FILE (mode 0600; an
    /// existing file is never overwritten) and prints the public key, which every
    /// member is started with (`--authority`).
    Init(AuthorityInitArgs),
    /// Issue a member certificate: binds a node id to a host name, overlay addresses,
    /// groups and what it may offer, for a validity period, stamped with the time it
    /// is issued (members refuse a key's older certificates once they saw a newer
    /// one). Prints it (one line). A host name or address already signed for another
    /// key is refused (the ledger KEY.ledger beside the key file records each); to
    /// move one to a new key, revoke the old key (`weft authority revoke`) and sign
    /// with --replace.
    Sign(Box<AuthoritySignArgs>),
    /// Revoke a node id (or an invite, `--invite`): prints a signed revocation (one
    /// line) for `weft revoke add`, which the mesh carries to every member.
    Revoke(AuthorityRevokeArgs),
    /// Make an invite: prints a token (one line) with which `weft up --join TOKEN`
    /// joins a new machine, getting its certificate from an issuer (a member started
    /// with --authority-key) among the entry points.
    Invite(Box<AuthorityInviteArgs>),
    /// Sign an access policy file (after checking it): prints the signed policy (one
    /// line) for `weft policy push`, which the mesh carries to every member.
    SignPolicy(AuthoritySignPolicyArgs),
}

/// Arguments of `weft web`.
#[derive(Debug, Args)]
pub struct WebArgs {
    /// Read settings from this TOML file (keys: the flags' names, e.g. listen,
    /// tls-cert, tls-key, token-file, authority-key, session-lifetime); flags and
    /// their environment variables win over it.
    #[arg(long, value_name = "FILE", env = "WEFT_WEB_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address and port to serve the console on (default 127.0.0.1:8787). Anything
    /// but a loopback address needs --tls-cert and --tls-key, or --insecure-http.
    #[arg(long, value_name = "ADDR:PORT", env = "WEFT_WEB_LISTEN")]
    pub listen: Option<String>,
    /// Control socket of the node (default: the node's, as for `weft status`).
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL")]
    pub control: Option<PathBuf>,
    /// Keep the login token in FILE (mode 0600): read when it exists, made and written
    /// when it does not (for a service). Without it, each start makes a new token.
    #[arg(long, value_name = "FILE", env = "WEFT_WEB_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM, mode 0600).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback address: the login token and the session
    /// cookie cross the network readable by anyone on the path.
    #[arg(long)]
    pub insecure_http: bool,
    /// The authority's private key file: the console then signs and pushes policies,
    /// makes invites and revokes members. The key never leaves this process.
    #[arg(long, value_name = "FILE", env = "WEFT_WEB_AUTHORITY_KEY")]
    pub authority_key: Option<PathBuf>,
    /// The network's secret, which invites carry (prefer WEFT_NETWORK_SECRET); invites
    /// are offered only with it and --authority-key.
    #[arg(long, value_name = "SECRET", env = "WEFT_NETWORK_SECRET", hide_env_values = true)]
    pub network_secret: Option<crate::config::values::Secret>,
    /// How long a login lasts (a number and s, m, h or d; default 12h); a session
    /// unused for an hour ends sooner.
    #[arg(long, value_name = "DURATION")]
    pub session_lifetime: Option<String>,
}

/// Arguments of `weft authority sign-policy`.
#[derive(Debug, Args)]
pub struct AuthoritySignPolicyArgs {
    /// The authority's private key file.
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// The policy file (TOML).
    #[arg(value_name = "POLICY")]
    pub file: PathBuf,
    /// The network it is for (members of another network the same authority serves
    /// refuse it).
    #[arg(long, value_name = "NAME")]
    pub network_name: String,
    /// Its version (default: the current time in seconds, so a later signature is
    /// newer); members keep the newest.
    #[arg(long = "policy-version", value_name = "N")]
    pub policy_version: Option<u64>,
}

/// Arguments of `weft authority invite`.
#[derive(Debug, Args)]
pub struct AuthorityInviteArgs {
    /// The authority's private key file.
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// The network the invite joins.
    #[arg(long, value_name = "NAME")]
    pub network_name: String,
    /// The network's secret, carried in the token (prefer WEFT_NETWORK_SECRET).
    #[arg(long, value_name = "SECRET", env = "WEFT_NETWORK_SECRET", hide_env_values = true)]
    pub network_secret: crate::config::values::Secret,
    /// An entry point the new machine contacts (repeatable): a member's udp:// URI;
    /// at least one should be an issuer (started with --authority-key).
    #[arg(short = 'p', long = "peer", value_name = "URI", required = true)]
    pub peers: Vec<String>,
    /// Groups the issued certificates carry, comma-separated.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub groups: Vec<String>,
    /// How long the invite may be used: a number and s, m, h, d or w.
    #[arg(long, value_name = "DURATION", default_value = "24h")]
    pub expires: String,
    /// How many machines may join with it (0: any number until it expires).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub uses: u32,
    /// How long the certificates issued for it are valid.
    #[arg(long, value_name = "DURATION", default_value = "365d")]
    pub cert_expires: String,
}

/// Arguments of `weft authority init`.
#[derive(Debug, Args)]
pub struct AuthorityInitArgs {
    /// Where to write the private key.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Arguments of `weft authority sign`.
#[derive(Debug, Args)]
pub struct AuthoritySignArgs {
    /// The authority's private key file (`weft authority init`).
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// The member's node id (`weft id` on it: 64 hex digits).
    #[arg(long, value_name = "ID")]
    pub node_id: String,
    /// The member's host name (what Magic DNS and `weft status` call it).
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// The member's IPv4 overlay address with the network's prefix.
    #[arg(long, value_name = "ADDR/PREFIX")]
    pub ipv4: String,
    /// The member's IPv6 overlay address with its prefix (default: none granted).
    #[arg(long, value_name = "ADDR/PREFIX")]
    pub ipv6: Option<String>,
    /// Groups (tags) for access policy, comma-separated.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub groups: Vec<String>,
    /// A subnet the member may proxy into the mesh (repeat for more).
    #[arg(long = "subnet", value_name = "CIDR")]
    pub subnets: Vec<String>,
    /// The member may offer itself as an exit node.
    #[arg(long)]
    pub exit: bool,
    /// The member may run a WireGuard portal.
    #[arg(long)]
    pub portal: bool,
    /// The member issues certificates to machines with an invite (it runs with
    /// --authority-key): new machines hand their invite only to a member marked so.
    #[arg(long)]
    pub issuer: bool,
    /// How long it is valid from now: a number and s, m, h, d or w (e.g. 90d).
    #[arg(long, value_name = "DURATION", default_value = "365d")]
    pub expires: String,
    /// The network it is valid in (default: any network that trusts this authority).
    #[arg(long, value_name = "NAME")]
    pub network_name: Option<String>,
    /// Give this key a host name or address the authority signed for another key
    /// before. Allowed only once that key is revoked (`weft authority revoke`, which
    /// the ledger records). Without it, a name or address signed for another key is
    /// refused: the ledger beside the key file (KEY.ledger) binds each to one key.
    #[arg(long)]
    pub replace: bool,
}

/// Arguments of `weft authority revoke`.
#[derive(Debug, Args)]
pub struct AuthorityRevokeArgs {
    /// The authority's private key file.
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// The node id to revoke (64 hex digits, as `weft id` and `weft cert show` print it).
    #[arg(value_name = "NODE-ID", required_unless_present = "invite", conflicts_with = "invite")]
    pub node_id: Option<String>,
    /// Revoke an invite instead (its token, or the invite id `weft-invite` tokens
    /// carry): issuers refuse it from then on.
    #[arg(long, value_name = "TOKEN|ID")]
    pub invite: Option<String>,
}

/// Arguments of `weft id`.
#[derive(Debug, Args)]
pub struct IdArgs {
    /// State directory holding the node key (default: `weft up`'s, /var/lib/weft for
    /// root).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// `weft revoke`.
#[derive(Debug, Subcommand)]
pub enum RevokeCommand {
    /// Give the running node a revocation; it keeps it and floods it to the mesh.
    Add(RevokeAddArgs),
}

/// Arguments of `weft revoke add`.
#[derive(Debug, Args)]
pub struct RevokeAddArgs {
    /// The revocation (`weft-revocation:...`) or a file holding it.
    #[arg(value_name = "REVOCATION|FILE")]
    pub revocation: String,
    /// Control socket of the node.
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL", default_value_os_t = default_control())]
    pub control: PathBuf,
}

/// `weft policy`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Parse a policy file and run its tests (names resolve through its `[hosts]`):
    /// exits 2 naming the first problem.
    Check(PolicyCheckArgs),
    /// Which rule of the running node's policy decides a flow from SRC to DST:PORT.
    Explain(PolicyExplainArgs),
    /// The last flows the running node's policy denied, newest first (one line per
    /// flow, with how often and when last).
    Denials(QueryArgs),
    /// Hand a policy the authority signed (`weft authority sign-policy`) to a running
    /// node, which puts it in force and passes it to every member (root or the
    /// weft-admin group only).
    Push(PolicyPushArgs),
}

/// Arguments of `weft policy push`.
#[derive(Debug, Args)]
pub struct PolicyPushArgs {
    /// The signed policy (`weft-policy:...`) or a file holding it.
    #[arg(value_name = "SIGNED|FILE")]
    pub policy: String,
    /// Control socket of the node.
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL", default_value_os_t = default_control())]
    pub control: PathBuf,
}

/// Arguments of `weft policy check`.
#[derive(Debug, Args)]
pub struct PolicyCheckArgs {
    /// The policy file (TOML).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// Arguments of `weft policy explain`.
#[derive(Debug, Args)]
pub struct PolicyExplainArgs {
    /// The source: a member's host name or node id, or an address.
    #[arg(value_name = "SRC")]
    pub from: String,
    /// The destination and port, `NAME:PORT` (a member, or an address).
    #[arg(value_name = "DST:PORT")]
    pub to: String,
    /// tcp, udp or icmp.
    #[arg(long, default_value = "tcp")]
    pub proto: String,
    /// Control socket of the node.
    #[arg(long, value_name = "PATH", env = "WEFT_CONTROL", default_value_os_t = default_control())]
    pub control: PathBuf,
}

/// `weft cert`.
#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Print a certificate in words: node id, host name, addresses, groups, grants,
    /// validity, authority. Checks its signature against the authority it names.
    Show(CertShowArgs),
}

/// Arguments of `weft cert show`.
#[derive(Debug, Args)]
pub struct CertShowArgs {
    /// The certificate (`weft-cert:...`) or a file holding it.
    #[arg(value_name = "CERT|FILE")]
    pub cert: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `weft version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print `{"version", "commit", "protocol", "min_protocol"}` as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `weft completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// Shell to complete for, e.g. `weft completions bash > /usr/share/bash-completion/completions/weft`.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// `weft man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Print the page of this subcommand (weft-COMMAND(1)) instead of weft(1).
    #[arg(value_name = "COMMAND", conflicts_with = "markdown")]
    pub command: Option<String>,
    /// Print the whole command-line reference as Markdown instead
    /// (docs/reference/cli.md).
    #[arg(long)]
    pub markdown: bool,
}

#[cfg(test)]
mod tests {
    /// Clap's own checks of every subcommand (unique names, valid defaults), which
    /// otherwise fire only when that subcommand runs.
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
