//! The window: overview, peers and routes tables, throughput plot and actions.
//!
//! Each frame copies what it needs out of the worker's [`State`](crate::client::State)
//! into a `View` under the lock, releases it, and draws from the copy. Actions go to
//! the worker through [`Client::send`]; nothing here touches a socket.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use eframe::egui::{self, Color32, RichText, Ui};
use egui_extras::{Column, TableBuilder};
use egui_plot::{HoverPosition, Legend, Line, Plot};
use weft_control::{ExitState, Request, StatusJson};

use crate::client::{Client, Link, Outcome, POLL_INTERVAL};
use crate::model::{
    ClientState, EdgeKind, HISTORY, Health, MeshMap, PeerColumn, PeerRow, PortalRow, Rate, RouteRow, Series, Sort,
    format_duration, format_rate, format_rate_in, unit_for,
};

/// The whole window's contents and the choices the user made in it.
#[derive(Debug)]
pub struct Dashboard {
    client: Client,
    sort: Sort,
    plotted: BTreeSet<String>,
    add_uri: String,
}

/// What one frame draws, copied out of the worker's state.
struct View {
    link: Link,
    status: Option<Arc<StatusJson>>,
    peers: Vec<PeerRow>,
    routes: Vec<RouteRow>,
    portal: Vec<PortalRow>,
    map: MeshMap,
    total: Option<Rate>,
    total_series: Series,
    peer_series: Vec<(String, Series)>,
    outcomes: Vec<Outcome>,
}

impl Dashboard {
    /// A dashboard over the node that `client` talks to.
    pub fn new(client: Client) -> Self {
        Self { client, sort: Sort::default(), plotted: BTreeSet::new(), add_uri: String::new() }
    }

    /// Draws the window into `ui` (the whole viewport).
    pub fn show(&mut self, ui: &mut Ui) {
        // The worker repaints on every poll; this keeps the clock-driven parts (plot
        // x axis) moving even if a poll hangs for its full timeout.
        ui.ctx().request_repaint_after(Duration::from_secs(1));
        let view = self.view();
        egui::Panel::top("overview").show(ui, |ui| self.overview(ui, &view));
        if view.status.is_some() {
            egui::Panel::bottom("throughput")
                .resizable(true)
                .default_size(ui.available_height() * 0.38)
                .min_size(120.0)
                .show(ui, |ui| {
                    // The throughput plot and the mesh map side by side.
                    ui.columns(2, |c| {
                        self.plot(&mut c[0], &view);
                        mesh_map(&mut c[1], &view.map);
                    });
                });
        }
        egui::CentralPanel::default().show(ui, |ui| {
            egui::ScrollArea::vertical().auto_shrink(false).show(ui, |ui| {
                if view.status.is_some() {
                    self.actions(ui, &view);
                    ui.add_space(6.0);
                    self.peers_table(ui, &view);
                    ui.add_space(10.0);
                    routes_table(ui, &view.routes);
                    if let Some(p) = view.status.as_ref().and_then(|s| s.wg_portal.as_ref()) {
                        ui.add_space(10.0);
                        portal_table(ui, p, &view.portal);
                    }
                } else {
                    self.problem(ui, &view);
                }
            });
        });
    }

    /// One line on what the window shows, for the screenshot mode's report: `peers:
    /// HOST OVERLAY HEALTH PATH, ...; plot points: N; total rx B/s: X; total tx B/s: Y;
    /// plotted: HOST OVERLAY, ...; map: Mesh map: N members, ...`.
    pub fn summary(&self) -> String {
        let v = self.view();
        let peers: Vec<String> =
            v.peers.iter().map(|p| format!("{} {} {} {}", p.hostname, p.overlay, p.health.label(), p.path)).collect();
        let plotted: Vec<&str> = v.peer_series.iter().map(|(name, _)| name.as_str()).collect();
        let rate = v.total.unwrap_or_default();
        format!(
            "peers: {}; plot points: {}; total rx B/s: {:.0}; total tx B/s: {:.0}; plotted: {}; map: {}",
            peers.join(", "),
            v.total_series.rx.len(),
            rate.rx,
            rate.tx,
            plotted.join(", "),
            v.map.summary()
        )
    }

    fn view(&self) -> View {
        let now = Instant::now();
        let st = self.client.state();
        let mut peers: Vec<PeerRow> = st
            .status
            .as_ref()
            .map(|s| s.peers.iter().map(|p| PeerRow::new(p, &st.history)).collect())
            .unwrap_or_default();
        self.sort.apply(&mut peers);
        let routes = st.status.as_ref().map(|s| s.routes.iter().map(RouteRow::new).collect()).unwrap_or_default();
        let portal = st.status.as_deref().map(PortalRow::rows).unwrap_or_default();
        let map = st.status.as_deref().map(MeshMap::new).unwrap_or_default();
        let peer_series = peers
            .iter()
            .filter(|p| self.plotted.contains(&p.node_id))
            .map(|p| (peer_name(p), st.history.peer_series(now, &p.node_id)))
            .collect();
        View {
            link: st.link.clone(),
            status: st.status.clone(),
            peers,
            routes,
            portal,
            map,
            total: st.history.total_rate(),
            total_series: st.history.total_series(now),
            peer_series,
            outcomes: st.outcomes.clone(),
        }
    }

    fn overview(&self, ui: &mut Ui, view: &View) {
        ui.add_space(4.0);
        ui.horizontal_wrapped(|ui| {
            let title =
                view.status.as_ref().map_or_else(|| "Weft".to_owned(), |s| format!("Weft · {}", s.network_name));
            ui.heading(title);
            ui.separator();
            let socket = self.client.control().display();
            match &view.link {
                Link::Up => ui.label(RichText::new(format!("• connected to {socket}")).color(ok_color(ui))),
                Link::Connecting => ui.label(format!("connecting to {socket}…")),
                Link::Down(p) => {
                    ui.label(RichText::new(format!("• {}", p.headline())).color(ui.visuals().error_fg_color))
                }
            };
        });
        let Some(s) = &view.status else {
            ui.add_space(4.0);
            return;
        };
        egui::Grid::new("overview-grid").num_columns(8).spacing([12.0, 4.0]).show(ui, |ui| {
            field(ui, "Node id", &s.node_id);
            field(ui, "Host", &s.hostname);
            field(ui, "Overlay", &s.overlay);
            field(ui, "Cipher", &s.cipher);
            ui.end_row();
            field(ui, "Uptime", &format_duration(s.uptime_secs));
            field(ui, "Offloads", &offloads(s));
            field(ui, "Device", &format!("{} ({} pipelines)", s.dev_name, s.threads));
            field(ui, "Connections", &format!("{} (tcp, ws, quic)", s.connections));
            ui.end_row();
            let rate = |f: fn(Rate) -> f64| view.total.map_or_else(|| "…".to_owned(), |r| format_rate(f(r)));
            field(ui, "Total rx", &rate(|r| r.rx));
            field(ui, "Total tx", &rate(|r| r.tx));
            let up = view.peers.iter().filter(|p| p.health == Health::Up).count();
            field(ui, "Peers up", &format!("{up} of {}", view.peers.len()));
            ui.end_row();
        });
        // Lists of any length wrap on lines of their own rather than widen the grid.
        if let Some(a6) = &s.overlay6 {
            ui.horizontal_wrapped(|ui| field(ui, "IPv6 overlay", a6));
        }
        for (name, list) in [("Listeners", &s.listeners), ("Proxies", &s.proxy_networks)] {
            if !list.is_empty() {
                ui.horizontal_wrapped(|ui| field(ui, name, &list.join(", ")));
            }
        }
        if let Some(d) = &s.magic_dns {
            let name = d.name.as_deref().unwrap_or("-");
            ui.horizontal_wrapped(|ui| field(ui, "Magic DNS", &format!("{name} ({} names in {})", d.names, d.domain)));
        }
        if s.exit_node {
            ui.horizontal_wrapped(|ui| field(ui, "Exit node", "this node, offered to members"));
        }
        if let Some(e) = &s.exit {
            let name = e.hostname.as_deref().unwrap_or(&e.wanted);
            let line = format!("via {name}: {}", e.state.as_str().replace('_', " "));
            ui.horizontal_wrapped(|ui| {
                let routing = e.state == ExitState::Routing;
                ui.label(RichText::new("Exit node").weak());
                let color = if routing { ok_color(ui) } else { ui.visuals().error_fg_color };
                ui.label(RichText::new(line).color(color));
            });
        }
        for c in &s.address_conflicts {
            ui.label(RichText::new(format!("Address conflict: {c}")).color(ui.visuals().error_fg_color));
        }
        ui.add_space(4.0);
    }

    fn problem(&self, ui: &mut Ui, view: &View) {
        ui.add_space(24.0);
        let socket = self.client.control().display().to_string();
        match &view.link {
            Link::Down(p) => {
                ui.label(RichText::new(p.headline()).heading().color(ui.visuals().error_fg_color));
                ui.add_space(8.0);
                ui.label(format!("Tried the control socket {socket}:"));
                ui.label(RichText::new(p.detail()).monospace());
                ui.add_space(8.0);
                ui.label(p.advice());
                ui.add_space(8.0);
                ui.label(
                    RichText::new(format!(
                        "Retrying every {} ms; this window updates by itself.",
                        POLL_INTERVAL.as_millis()
                    ))
                    .weak(),
                );
            }
            Link::Connecting | Link::Up => {
                ui.label(format!("Connecting to {socket}…"));
            }
        }
    }

    fn actions(&mut self, ui: &mut Ui, view: &View) {
        ui.horizontal(|ui| {
            let label = ui.label("Add peer:");
            let edit = ui.add(
                egui::TextEdit::singleline(&mut self.add_uri)
                    .hint_text("udp://HOST:PORT")
                    .desired_width(280.0)
                    .id_salt("add-peer-uri"),
            );
            let edit = edit.labelled_by(label.id);
            let uri = self.add_uri.trim().to_owned();
            let enter = edit.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            let clicked = ui.add_enabled(!uri.is_empty(), egui::Button::new("Add")).clicked();
            if (clicked || enter) && !uri.is_empty() {
                self.client.send(Request::AddPeer { uri });
                self.add_uri.clear();
            }
        });
        for o in &view.outcomes {
            let (word, color) = if o.ok { ("done", ok_color(ui)) } else { ("error", ui.visuals().error_fg_color) };
            ui.label(RichText::new(format!("{} — {word}: {}", o.action, o.message)).color(color));
        }
        if let Some(s) = &view.status {
            for p in &s.pending_peers {
                let why = p.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
                ui.label(RichText::new(format!("dialling {} ({} attempts){why}", p.endpoint, p.attempts)).weak());
            }
        }
    }

    fn peers_table(&mut self, ui: &mut Ui, view: &View) {
        ui.label(RichText::new(format!("Peers ({})", view.peers.len())).strong());
        if view.peers.is_empty() {
            ui.label("No peers yet: add one above, or start another node with -p pointing at this one.");
            return;
        }
        let em = ui.text_style_height(&egui::TextStyle::Body);
        let row_height = em + 6.0;
        let mut table = TableBuilder::new(ui)
            .id_salt("peers")
            .striped(true)
            .resizable(true)
            .vscroll(false)
            .cell_layout(egui::Layout::left_to_right(egui::Align::Center))
            .column(Column::auto()); // plot toggle
        // Initial widths fit typical values at the body font; every column can be dragged.
        for c in PeerColumn::ALL {
            let ems = match c {
                PeerColumn::Endpoint => 11.0,
                PeerColumn::Overlay => 8.0,
                PeerColumn::Path | PeerColumn::State => 7.5,
                PeerColumn::Hostname => 6.0,
                PeerColumn::Rx | PeerColumn::Tx => 5.5,
                PeerColumn::Transport => 5.5,
                PeerColumn::Latency | PeerColumn::Age => 4.5,
                PeerColumn::Loss => 3.5,
            };
            table = table.column(Column::initial(ems * em).at_least(2.5 * em).clip(true));
        }
        let table = table.column(Column::remainder().at_least(70.0)); // remove
        // One unit for the whole Rx and Tx columns: the largest rate's.
        let unit = unit_for(view.peers.iter().filter_map(|p| p.rate).map(|r| r.rx.max(r.tx)).fold(0.0, f64::max));
        let mut sort = self.sort;
        table
            .header(row_height, |mut header| {
                header.col(|ui| {
                    ui.strong("Plot");
                });
                for c in PeerColumn::ALL {
                    header.col(|ui| {
                        let b = ui.add(egui::Button::selectable(sort.column == c, c.title()));
                        if sort.column == c {
                            sort_arrow(ui, sort.descending);
                        }
                        if b.on_hover_text("sort by this column; click again to reverse").clicked() {
                            sort = sort.clicked(c);
                        }
                    });
                }
                header.col(|ui| {
                    ui.strong("");
                });
            })
            .body(|mut body| {
                for p in &view.peers {
                    body.row(row_height, |mut row| self.peer_row(&mut row, p, unit));
                }
            });
        self.sort = sort;
    }

    fn peer_row(&mut self, row: &mut egui_extras::TableRow<'_, '_>, p: &PeerRow, unit: usize) {
        let down = !matches!(p.health, Health::Up | Health::Idle);
        let cell = |row: &mut egui_extras::TableRow<'_, '_>, text: String| {
            row.col(|ui| {
                let color = match p.health {
                    Health::Up => ui.visuals().text_color(),
                    Health::Connecting => ui.visuals().warn_fg_color,
                    Health::Idle => ui.visuals().weak_text_color(),
                    Health::Down => ui.visuals().error_fg_color,
                };
                if down {
                    let bg = color.gamma_multiply(0.15);
                    ui.painter().rect_filled(ui.max_rect(), 0.0, bg);
                }
                ui.add(egui::Label::new(RichText::new(text).color(color)).truncate());
            });
        };
        row.col(|ui| {
            let mut on = self.plotted.contains(&p.node_id);
            let r = ui.checkbox(&mut on, "").on_hover_text(format!("plot {} in the throughput chart", peer_name(p)));
            if r.changed() {
                if on {
                    self.plotted.insert(p.node_id.clone());
                } else {
                    self.plotted.remove(&p.node_id);
                }
            }
        });
        for c in PeerColumn::ALL {
            let text = match c {
                PeerColumn::Overlay => match &p.overlay6 {
                    Some(a6) => format!("{} {a6}", p.overlay),
                    None => p.overlay.clone(),
                },
                PeerColumn::Hostname => p.hostname.clone(),
                PeerColumn::State => match &p.error {
                    Some(e) if down => format!("{} ({e})", p.health.label()),
                    _ => p.health.label().to_owned(),
                },
                PeerColumn::Path => p.path.clone(),
                PeerColumn::Transport => p.transport.clone(),
                PeerColumn::Endpoint => p.endpoint.clone().unwrap_or_else(|| "—".into()),
                PeerColumn::Latency => p.rtt_ms.map_or_else(|| "—".into(), |ms| format!("{ms:.1} ms")),
                PeerColumn::Loss => p.loss.map_or_else(|| "—".into(), |l| format!("{:.0} %", l * 100.0)),
                PeerColumn::Rx => p.rate.map_or_else(|| "…".into(), |r| format_rate_in(r.rx, unit)),
                PeerColumn::Tx => p.rate.map_or_else(|| "…".into(), |r| format_rate_in(r.tx, unit)),
                PeerColumn::Age => p.session_age_secs.map_or_else(|| "—".into(), format_duration),
            };
            cell(row, text);
        }
        row.col(|ui| {
            let b = ui.button("Remove").on_hover_text(format!("remove-peer {} ({})", p.node_id, peer_name(p)));
            if b.clicked() {
                self.client.send(Request::RemovePeer { peer: p.node_id.clone() });
            }
        });
    }

    fn plot(&self, ui: &mut Ui, view: &View) {
        ui.horizontal(|ui| {
            ui.strong("Throughput (up to the last 5 minutes)");
            ui.label(RichText::new("(tick Plot in a peer's row to add it)").weak());
        });
        // The x axis starts at a minute and widens with the history, up to five minutes.
        let oldest = view.total_series.rx.first().map_or(0.0, |p| -p[0]);
        let window = (oldest.max(60.0)).min(HISTORY.as_secs_f64());
        // One unit on the whole axis: the largest value's.
        let peak = view
            .total_series
            .rx
            .iter()
            .chain(&view.total_series.tx)
            .chain(view.peer_series.iter().flat_map(|(_, s)| s.rx.iter().chain(&s.tx)))
            .map(|p| p[1])
            .fold(0.0, f64::max);
        let axis_unit = unit_for(peak);
        Plot::new("throughput-plot")
            .legend(Legend::default())
            .include_x(-window)
            .include_x(0.0)
            .include_y(0.0)
            .allow_drag(false)
            .allow_zoom(false)
            .allow_scroll(false)
            .x_axis_label("seconds ago")
            .x_axis_formatter(|m, _| format!("{:.0}", -m.value))
            .y_axis_formatter(move |m, _| format_rate_in(m.value, axis_unit))
            .label_formatter(|hover| match hover {
                HoverPosition::NearDataPoint { plot_name, position, .. } => {
                    Some(format!("{plot_name}\n{:.0} s ago: {}", -position.x, format_rate(position.y)))
                }
                HoverPosition::Elsewhere { .. } => None,
            })
            .show(ui, |plot| {
                plot.line(Line::new("total rx", view.total_series.rx.clone()).width(2.0));
                plot.line(Line::new("total tx", view.total_series.tx.clone()).width(2.0));
                for (name, s) in &view.peer_series {
                    plot.line(Line::new(format!("{name} rx"), s.rx.clone()));
                    plot.line(Line::new(format!("{name} tx"), s.tx.clone()));
                }
            });
    }
}

fn routes_table(ui: &mut Ui, routes: &[RouteRow]) {
    ui.label(RichText::new(format!("Routes ({})", routes.len())).strong());
    if routes.is_empty() {
        ui.label("No routes: this node knows no other member yet.");
        return;
    }
    let em = ui.text_style_height(&egui::TextStyle::Body);
    let row_height = em + 6.0;
    TableBuilder::new(ui)
        .id_salt("routes")
        .striped(true)
        .resizable(true)
        .vscroll(false)
        .cell_layout(egui::Layout::left_to_right(egui::Align::Center))
        .column(Column::initial(14.0 * em).at_least(4.0 * em).clip(true))
        .column(Column::initial(8.0 * em).at_least(3.0 * em).clip(true))
        .columns(Column::initial(4.5 * em).at_least(2.5 * em), 3)
        .column(Column::remainder().at_least(5.0 * em).clip(true))
        .header(row_height, |mut h| {
            for t in ["Destination", "Next hop", "Hops", "Latency", "Session", "Proxied subnets"] {
                h.col(|ui| {
                    ui.strong(t);
                });
            }
        })
        .body(|mut body| {
            for r in routes {
                body.row(row_height, |mut row| {
                    for text in [
                        r.destination.clone(),
                        r.next_hop.clone(),
                        r.hops.to_string(),
                        format!("{} ms", r.latency_ms),
                        if r.session { "up" } else { "none" }.to_owned(),
                        or_none(&r.proxied),
                    ] {
                        row.col(|ui| {
                            ui.add(egui::Label::new(text).truncate());
                        });
                    }
                });
            }
        });
}

/// The mesh as a picture: this node in the middle (highlighted), the members on a
/// circle around it, solid lines for direct paths and dashed ones from the first relay
/// to each relayed member; hover a member for its path, transport, latency and loss.
fn mesh_map(ui: &mut Ui, map: &MeshMap) {
    let summary = map.summary();
    ui.horizontal(|ui| {
        ui.strong("Mesh map");
        ui.label(RichText::new(&summary).weak());
    });
    {
        let height = ui.available_height().max(120.0);
        let (rect, _) = ui.allocate_exact_size(egui::vec2(ui.available_width(), height), egui::Sense::hover());
        let painter = ui.painter_at(rect);
        let center = rect.center();
        let radius = (rect.height() * 0.5 - 28.0).max(30.0);
        let others = map.nodes.len().saturating_sub(1).max(1) as f32;
        let pos: Vec<egui::Pos2> = (0..map.nodes.len())
            .map(|i| {
                if i == 0 {
                    return center;
                }
                // Start at the top, clockwise; a wider ellipse uses the panel's width.
                let a = (i - 1) as f32 / others * std::f32::consts::TAU - std::f32::consts::FRAC_PI_2;
                let rx = (rect.width() * 0.5 - 90.0).clamp(radius, radius * 2.2);
                center + egui::vec2(rx * a.cos(), radius * a.sin())
            })
            .collect();
        let visuals = ui.visuals();
        let direct = egui::Stroke::new(2.0, ok_color(ui));
        let relayed = egui::Stroke::new(1.5, visuals.weak_text_color());
        for e in &map.edges {
            let (a, b) = (pos[e.from], pos[e.to]);
            match e.kind {
                EdgeKind::Direct => {
                    painter.line_segment([a, b], direct);
                }
                EdgeKind::Relayed => {
                    painter.extend(egui::Shape::dashed_line(&[a, b], relayed, 6.0, 4.0));
                }
            }
        }
        for (i, n) in map.nodes.iter().enumerate() {
            let fill = match (n.me, n.health) {
                (true, _) => visuals.selection.bg_fill,
                (false, Health::Up) => ok_color(ui),
                (false, Health::Idle) => visuals.weak_text_color(),
                (false, Health::Connecting) => Color32::from_rgb(220, 170, 40),
                (false, Health::Down) => visuals.error_fg_color,
            };
            let r = if n.me { 11.0 } else { 8.0 };
            painter.circle(pos[i], r, fill, egui::Stroke::new(1.0, visuals.strong_text_color()));
            let label = if n.me { format!("{} (this node)", n.label) } else { n.label.clone() };
            painter.text(
                pos[i] + egui::vec2(0.0, r + 3.0),
                egui::Align2::CENTER_TOP,
                label,
                egui::FontId::proportional(12.0),
                visuals.strong_text_color(),
            );
            let hover = egui::Rect::from_center_size(pos[i], egui::vec2(2.0 * r + 8.0, 2.0 * r + 8.0));
            ui.interact(hover, ui.scope_id().with(("map-node", i)), egui::Sense::hover()).on_hover_text(&n.detail);
        }
    }
}

fn portal_table(ui: &mut Ui, portal: &weft_control::PortalJson, rows: &[PortalRow]) {
    ui.label(RichText::new(format!("WireGuard clients ({})", rows.len())).strong());
    ui.label(
        RichText::new(format!("portal {} for {} · public key {}", portal.listen, portal.net, portal.public_key)).weak(),
    );
    if rows.is_empty() {
        ui.label("No clients yet: add one with `weft wg add NAME`.");
        return;
    }
    let em = ui.text_style_height(&egui::TextStyle::Body);
    let row_height = em + 6.0;
    TableBuilder::new(ui)
        .id_salt("portal")
        .striped(true)
        .resizable(true)
        .vscroll(false)
        .cell_layout(egui::Layout::left_to_right(egui::Align::Center))
        .column(Column::initial(8.0 * em).at_least(4.0 * em).clip(true))
        .column(Column::initial(7.0 * em).at_least(4.0 * em).clip(true))
        .column(Column::initial(7.0 * em).at_least(4.0 * em).clip(true))
        .column(Column::initial(11.0 * em).at_least(4.0 * em).clip(true))
        .column(Column::initial(6.0 * em).at_least(3.0 * em).clip(true))
        .column(Column::remainder().at_least(5.0 * em).clip(true))
        .header(row_height, |mut h| {
            for t in ["Client", "Address", "State", "Endpoint", "Handshake", "Received / sent"] {
                h.col(|ui| {
                    ui.strong(t);
                });
            }
        })
        .body(|mut body| {
            for r in rows {
                body.row(row_height, |mut row| {
                    let active = r.state == ClientState::Active;
                    for (i, text) in [&r.name, &r.address, r.state.as_str(), &r.endpoint, &r.handshake, &r.traffic]
                        .into_iter()
                        .enumerate()
                    {
                        row.col(|ui| {
                            let t = RichText::new(text);
                            let t = if i == 2 && active { t.color(ok_color(ui)) } else { t };
                            ui.add(egui::Label::new(t).truncate());
                        });
                    }
                });
            }
        });
}

/// A small triangle after a sorted column's title: up for ascending, down for
/// descending (painted: the bundled font has no arrow glyphs).
fn sort_arrow(ui: &mut Ui, descending: bool) {
    let size = ui.text_style_height(&egui::TextStyle::Body) * 0.5;
    let (rect, _) = ui.allocate_exact_size(egui::vec2(size, size), egui::Sense::hover());
    let (top, bottom) = (rect.top(), rect.bottom());
    let points = if descending {
        vec![egui::pos2(rect.left(), top), egui::pos2(rect.right(), top), egui::pos2(rect.center().x, bottom)]
    } else {
        vec![egui::pos2(rect.left(), bottom), egui::pos2(rect.right(), bottom), egui::pos2(rect.center().x, top)]
    };
    let color = ui.visuals().strong_text_color();
    ui.painter().add(egui::Shape::convex_polygon(points, color, egui::Stroke::NONE));
}

/// A label and its value, as two grid cells.
fn field(ui: &mut Ui, name: &str, value: &str) {
    ui.label(RichText::new(name).weak());
    ui.label(value);
}

fn offloads(s: &StatusJson) -> String {
    let o = &s.offloads;
    let on: Vec<&str> = [(o.tun, "TUN"), (o.tun_gro, "TUN GRO"), (o.udp_gso, "UDP GSO"), (o.udp_gro, "UDP GRO")]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
    or_none(&on.join(", "))
}

fn or_none(s: &str) -> String {
    if s.is_empty() { "none".to_owned() } else { s.to_owned() }
}

fn peer_name(p: &PeerRow) -> String {
    format!("{} {}", p.hostname, p.overlay.split('/').next().unwrap_or(&p.overlay))
}

fn ok_color(ui: &Ui) -> Color32 {
    if ui.visuals().dark_mode { Color32::from_rgb(110, 200, 120) } else { Color32::from_rgb(20, 130, 40) }
}
