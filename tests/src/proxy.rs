//! Link faults without root: an in-process TCP proxy in front of every listener of every node.
//!
//! A [`Network`] owns one [`Proxy`] per (node, listener): it listens on its own 127.0.0.1
//! port and forwards each connection to the node's real listener. The cluster advertises the
//! proxy ports (`advertised.listeners`, `controller.quorum.voters`), so every connection
//! between nodes, and every client connection after bootstrap, goes through a proxy.
//!
//! On each accepted connection the proxy finds out who connected: the peer's port is looked
//! up in `/proc/net/tcp` and `/proc/net/tcp6` (the socket's inode), and the inode among the
//! open files of the nodes' processes (`/proc/<pid>/fd`, readable for our own children). A
//! connection from a node's process comes from that node; any other (the test's clients) from
//! [`Peer::Client`]. That is what makes single links cuttable although every node advertises
//! one address to everyone: a cut of the link (a, b) drops the established connections from
//! a to b and from b to a and refuses (accepts and closes at once) new ones, on every
//! listener; [`Network::heal`] lets them through again. Cutting is one-sided per direction, so
//! asymmetric partitions are possible too ([`Network::cut_one_way`]).
//!
//! Network namespaces (`unshare -n`, `ip netns`) would need CAP_NET_ADMIN (root) for veth
//! pairs between namespaces; the proxy needs nothing and works where CI runs unprivileged.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

/// Who is at one end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// A node's process, by `node.id`.
    Node(i32),
    /// Any other process (the test's clients, tools).
    Client,
}

/// Which listener of a node a proxy fronts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Listener {
    /// The PLAINTEXT (client and inter-broker) listener.
    Broker,
    /// The CONTROLLER listener.
    Controller,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent; a panic elsewhere does not matter.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One forwarded connection, to shut down on a cut.
struct Conn {
    from: Peer,
    to: i32,
    client: TcpStream,
    server: TcpStream,
    done: Arc<AtomicBool>,
}

/// State shared by every proxy of a [`Network`] and its threads.
struct Shared {
    /// Directed links that are cut: (from, to node).
    cut: Mutex<BTreeSet<(Peer, i32)>>,
    /// The process id of each running node.
    pids: Mutex<BTreeMap<i32, u32>>,
    conns: Mutex<Vec<Conn>>,
    stop: AtomicBool,
    /// Connections refused because their link was cut, for the test's report.
    refused: Mutex<u64>,
}

impl Shared {
    fn is_cut(&self, from: Peer, to: i32) -> bool {
        lock(&self.cut).contains(&(from, to))
    }

    /// Shuts down every established connection on a cut link.
    fn enforce(&self) {
        let cut = lock(&self.cut).clone();
        let mut conns = lock(&self.conns);
        conns.retain(|c| !c.done.load(Ordering::Relaxed));
        for c in conns.iter() {
            if cut.contains(&(c.from, c.to)) {
                c.client.shutdown(Shutdown::Both).ok();
                c.server.shutdown(Shutdown::Both).ok();
                c.done.store(true, Ordering::Relaxed);
            }
        }
        conns.retain(|c| !c.done.load(Ordering::Relaxed));
    }
}

/// The proxies of one cluster and the links between its nodes.
pub struct Network {
    shared: Arc<Shared>,
    proxies: Vec<Proxy>,
}

impl Default for Network {
    fn default() -> Self {
        Self::new()
    }
}

impl Network {
    /// A network without proxies and with every link up.
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                cut: Mutex::new(BTreeSet::new()),
                pids: Mutex::new(BTreeMap::new()),
                conns: Mutex::new(Vec::new()),
                stop: AtomicBool::new(false),
                refused: Mutex::new(0),
            }),
            proxies: Vec::new(),
        }
    }

    /// Starts a proxy on `127.0.0.1:<listen_port>` forwarding to `127.0.0.1:<target_port>`,
    /// the `listener` of `node`.
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub fn add_proxy(
        &mut self,
        node: i32,
        listener: Listener,
        listen_port: u16,
        target_port: u16,
    ) -> Result<()> {
        let proxy = Proxy::start(
            self.shared.clone(),
            node,
            listener,
            listen_port,
            target_port,
        )?;
        self.proxies.push(proxy);
        Ok(())
    }

    /// The port of the proxy in front of `node`'s `listener`.
    pub fn proxy_port(&self, node: i32, listener: Listener) -> Option<u16> {
        self.proxies
            .iter()
            .find(|p| p.node == node && p.listener == listener)
            .map(|p| p.port)
    }

    /// Tells the proxies that `node` runs as `pid` (`None`: not running), so that its
    /// connections are recognized as the node's.
    pub fn set_pid(&self, node: i32, pid: Option<u32>) {
        let mut pids = lock(&self.shared.pids);
        match pid {
            Some(p) => pids.insert(node, p),
            None => pids.remove(&node),
        };
    }

    /// A handle that [`Network::set_pid`]s without borrowing the network (for the nodes).
    pub fn pid_registry(&self) -> PidRegistry {
        PidRegistry {
            shared: self.shared.clone(),
        }
    }

    /// Cuts the link between nodes `a` and `b`, both directions.
    pub fn cut(&self, a: i32, b: i32) {
        {
            let mut cut = lock(&self.shared.cut);
            cut.insert((Peer::Node(a), b));
            cut.insert((Peer::Node(b), a));
        }
        self.shared.enforce();
    }

    /// Cuts connections from `from` to node `to` only (`to` can still connect to `from`).
    pub fn cut_one_way(&self, from: Peer, to: i32) {
        lock(&self.shared.cut).insert((from, to));
        self.shared.enforce();
    }

    /// Cuts `node` from every node in `others` (both directions), and from the clients too
    /// when `clients`.
    pub fn isolate(&self, node: i32, others: &[i32], clients: bool) {
        {
            let mut cut = lock(&self.shared.cut);
            for &o in others.iter().filter(|&&o| o != node) {
                cut.insert((Peer::Node(node), o));
                cut.insert((Peer::Node(o), node));
            }
            if clients {
                cut.insert((Peer::Client, node));
            }
        }
        self.shared.enforce();
    }

    /// Every link up again.
    pub fn heal(&self) {
        lock(&self.shared.cut).clear();
    }

    /// The directed links cut now.
    pub fn cut_links(&self) -> BTreeSet<(Peer, i32)> {
        lock(&self.shared.cut).clone()
    }

    /// Connections refused (closed at once) because their link was cut, since the start.
    pub fn refused(&self) -> u64 {
        *lock(&self.shared.refused)
    }

    /// Established connections through the proxies now, per (from, to node).
    pub fn connections(&self) -> BTreeMap<(Peer, i32), usize> {
        let mut out = BTreeMap::new();
        for c in lock(&self.shared.conns).iter() {
            if !c.done.load(Ordering::Relaxed) {
                *out.entry((c.from, c.to)).or_insert(0) += 1;
            }
        }
        out
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for c in lock(&self.shared.conns).drain(..) {
            c.client.shutdown(Shutdown::Both).ok();
            c.server.shutdown(Shutdown::Both).ok();
        }
        for p in &mut self.proxies {
            if let Some(t) = p.accept.take() {
                t.join().ok();
            }
        }
    }
}

/// Updates the node → pid map of a [`Network`] (held by each node of a cluster).
#[derive(Clone)]
pub struct PidRegistry {
    shared: Arc<Shared>,
}

impl PidRegistry {
    /// As [`Network::set_pid`].
    pub fn set(&self, node: i32, pid: Option<u32>) {
        let mut pids = lock(&self.shared.pids);
        match pid {
            Some(p) => pids.insert(node, p),
            None => pids.remove(&node),
        };
    }
}

/// One listening proxy.
struct Proxy {
    node: i32,
    listener: Listener,
    port: u16,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    fn start(
        shared: Arc<Shared>,
        node: i32,
        listener: Listener,
        port: u16,
        target_port: u16,
    ) -> Result<Self> {
        let sock = TcpListener::bind(("127.0.0.1", port))
            .with_context(|| format!("binding the proxy port {port}"))?;
        sock.set_nonblocking(true)?;
        let target = SocketAddr::from(([127, 0, 0, 1], target_port));
        let accept = std::thread::Builder::new()
            .name(format!("proxy-{node}-{listener:?}"))
            .spawn(move || accept_loop(&shared, &sock, node, port, target))
            .context("spawning a proxy thread")?;
        Ok(Self {
            node,
            listener,
            port,
            accept: Some(accept),
        })
    }
}

fn accept_loop(shared: &Arc<Shared>, sock: &TcpListener, node: i32, port: u16, target: SocketAddr) {
    while !shared.stop.load(Ordering::Relaxed) {
        let (client, peer) = match sock.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let from = identify(shared, peer.port(), port);
        if shared.is_cut(from, node) {
            *lock(&shared.refused) += 1;
            client.shutdown(Shutdown::Both).ok();
            continue;
        }
        if client.set_nonblocking(false).is_err() {
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
            // The node is down: the client sees a closed connection, as it would directly.
            client.shutdown(Shutdown::Both).ok();
            continue;
        };
        client.set_nodelay(true).ok();
        server.set_nodelay(true).ok();
        let done = Arc::new(AtomicBool::new(false));
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        ) else {
            continue;
        };
        lock(&shared.conns).push(Conn {
            from,
            to: node,
            client: c3,
            server: s3,
            done: done.clone(),
        });
        // A cut may have come in between the check and the registration.
        if shared.is_cut(from, node) {
            shared.enforce();
        }
        let d1 = done.clone();
        std::thread::spawn(move || pump(client, server, &d1));
        std::thread::spawn(move || pump(s2, c2, &done));
    }
}

/// Copies `from` to `to` until either ends, then shuts both down.
fn pump(mut from: TcpStream, mut to: TcpStream, done: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    from.shutdown(Shutdown::Both).ok();
    to.shutdown(Shutdown::Both).ok();
    done.store(true, Ordering::Relaxed);
}

/// Which process holds the client end of a connection to the proxy on `proxy_port` from
/// `127.0.0.1:<peer_port>`: a node (by its registered pid) or a client.
fn identify(shared: &Shared, peer_port: u16, proxy_port: u16) -> Peer {
    let Some(inode) = socket_inode(peer_port, proxy_port) else {
        return Peer::Client;
    };
    let pids = lock(&shared.pids).clone();
    let needle = format!("socket:[{inode}]");
    for (node, pid) in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == needle.as_str()) {
                return Peer::Node(node);
            }
        }
    }
    Peer::Client
}

/// The inode of the socket whose local port is `local_port` and remote port `remote_port`
/// (both on loopback), from `/proc/net/tcp` and `/proc/net/tcp6`.
fn socket_inode(local_port: u16, remote_port: u16) -> Option<u64> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        if let Some(inode) = find_inode(&text, local_port, remote_port) {
            return Some(inode);
        }
    }
    None
}

/// Parses a `/proc/net/tcp{,6}` table: `sl local_address rem_address st ... inode`, addresses
/// as `HEXIP:HEXPORT`.
fn find_inode(table: &str, local_port: u16, remote_port: u16) -> Option<u64> {
    let port_of = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            return None;
        }
        (port_of(f[1]) == Some(local_port) && port_of(f[2]) == Some(remote_port))
            .then(|| f[9].parse().ok())
            .flatten()
            .filter(|&i: &u64| i != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn parses_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
            0: 0100007F:1F90 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1\n   \
            1: 0100007F:A000 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(find_inode(table, 0xA000, 0x1F90), Some(4343));
        assert_eq!(find_inode(table, 0x1F90, 0xA000), Some(4242));
        assert_eq!(find_inode(table, 1, 2), None);
    }

    fn echo_server() -> (u16, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (port, t)
    }

    fn roundtrip(port: u16) -> std::io::Result<()> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"ping")?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf)?;
        assert_eq!(&buf, b"ping");
        Ok(())
    }

    #[test]
    fn passes_cuts_and_heals() {
        let (target, _server) = echo_server();
        let mut net = Network::new();
        let port = crate::free_port().unwrap();
        net.add_proxy(1, Listener::Broker, port, target).unwrap();
        assert_eq!(net.proxy_port(1, Listener::Broker), Some(port));
        roundtrip(port).unwrap();

        // An established connection is dropped by the cut...
        let mut open = TcpStream::connect(("127.0.0.1", port)).unwrap();
        open.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        open.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        open.read_exact(&mut buf).unwrap();
        // This test process is a client, not a node.
        let deadline = Instant::now() + Duration::from_secs(5);
        while net
            .connections()
            .get(&(Peer::Client, 1))
            .copied()
            .unwrap_or(0)
            == 0
        {
            assert!(Instant::now() < deadline, "{:?}", net.connections());
            std::thread::sleep(Duration::from_millis(10));
        }
        net.isolate(1, &[2, 3], true);
        assert!(matches!(open.read(&mut buf), Ok(0) | Err(_)));
        // ...and a new one is refused.
        assert!(roundtrip(port).is_err());
        assert!(net.refused() >= 1);
        // A cut between other nodes does not concern clients.
        net.heal();
        net.cut(2, 3);
        roundtrip(port).unwrap();
        net.heal();
        roundtrip(port).unwrap();
    }

    #[test]
    fn recognizes_a_node_by_its_pid() {
        let (target, _server) = echo_server();
        let mut net = Network::new();
        let port = crate::free_port().unwrap();
        net.add_proxy(2, Listener::Controller, port, target)
            .unwrap();
        // This process plays node 1: its connections are node 1's, so the link 1-2 cut
        // refuses them while a client-only cut would not.
        net.set_pid(1, Some(std::process::id()));
        roundtrip(port).unwrap();
        net.cut_one_way(Peer::Client, 2);
        roundtrip(port).unwrap();
        net.cut(1, 2);
        assert!(roundtrip(port).is_err());
        net.heal();
        roundtrip(port).unwrap();
        net.set_pid(1, None);
        net.cut(1, 2);
        roundtrip(port).unwrap();
    }
}
