//! The eframe application: the dashboard in a native window, and the optional
//! screenshot-and-exit mode used for documentation and the end-to-end test.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use eframe::egui;

use crate::args::Args;
use crate::client::Client;
use crate::ui::Dashboard;

/// Opens the window and runs until it is closed (or the screenshot is saved).
pub fn run(args: Args) -> Result<()> {
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("Weft")
            .with_app_id("weft-gui")
            // Points, not pixels: winit's scale factor maps them to the display's DPI.
            .with_inner_size([1280.0, 800.0])
            .with_min_inner_size([640.0, 400.0]),
        ..Default::default()
    };
    let saved: Arc<Mutex<Option<Result<(), String>>>> = Arc::default();
    let plan = args.screenshot.clone().map(|path| Screenshot {
        path,
        at: Instant::now() + Duration::from_secs_f64(args.screenshot_after.max(0.0)),
        requested: false,
        saved: Arc::clone(&saved),
    });
    eframe::run_native(
        "weft-gui",
        options,
        Box::new(move |cc| {
            let ctx = cc.egui_ctx.clone();
            let client = Client::spawn(args.control, move || ctx.request_repaint());
            Ok(Box::new(App { dashboard: Dashboard::new(client), screenshot: plan }))
        }),
    )
    .map_err(|e| anyhow!("cannot open the window: {e} (is DISPLAY set and an X server reachable?)"))?;
    if args.screenshot.is_some() {
        let outcome = saved.lock().unwrap_or_else(PoisonError::into_inner).take();
        outcome.unwrap_or_else(|| Err("the window closed before the screenshot".into())).map_err(|e| anyhow!(e))?;
    }
    Ok(())
}

struct App {
    dashboard: Dashboard,
    screenshot: Option<Screenshot>,
}

struct Screenshot {
    path: PathBuf,
    at: Instant,
    requested: bool,
    saved: Arc<Mutex<Option<Result<(), String>>>>,
}

impl eframe::App for App {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.dashboard.show(ui);
        let Some(shot) = &mut self.screenshot else { return };
        let now = Instant::now();
        if shot.requested {
            return;
        }
        if now < shot.at {
            ui.ctx().request_repaint_after(shot.at - now);
            return;
        }
        shot.requested = true;
        let (path, saved, ctx) = (shot.path.clone(), Arc::clone(&shot.saved), ui.ctx().clone());
        let summary = self.dashboard.summary();
        ui.ctx().request_screenshot(move |image| {
            let result = save_png(&path, &image).map_err(|e| format!("{e:#}"));
            if result.is_ok() {
                println!("saved {}; {summary}", path.display());
            }
            *saved.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            ctx.request_repaint();
        });
        ui.ctx().request_repaint();
    }
}

fn save_png(path: &std::path::Path, image: &egui::ColorImage) -> Result<()> {
    let [w, h] = image.size;
    let pixels: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    let img = image::RgbaImage::from_raw(u32::try_from(w)?, u32::try_from(h)?, pixels)
        .context("screenshot size does not match its pixels")?;
    img.save_with_format(path, image::ImageFormat::Png).with_context(|| format!("cannot write {}", path.display()))
}
