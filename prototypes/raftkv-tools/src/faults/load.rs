//! A run's recorded load: the clients ([`super::workload`]), the
//! watchers ([`super::watchers`]) and, with the gRPC API, a compactor
//! ([`super::grpc::compactor`]), started together and stopped together
//! (the watchers last, at the run's end).

use super::watchers::Watchers;
use super::workload::{self, Api, Rec};
use super::Params;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The compactor's stop signal and its task.
type Compactor = (watch::Sender<bool>, JoinHandle<Vec<(i64, bool)>>);

/// The recorded load of a run: its clients, its watchers, and (with the
/// gRPC API) its compactor.
pub(super) struct Load {
    /// The clients.
    pub clients: workload::Clients,
    watchers: Watchers,
    compactor: Option<Compactor>,
}

impl Load {
    /// Starts it all on `endpoints`, as `p` says.
    pub fn start(endpoints: &[String], seed: u64, base: Instant, p: &Params) -> Load {
        let counts = (p.clients, p.keys);
        let clients = workload::Clients::start(p.api, endpoints, counts, seed, base, p.op_deadline);
        let watchers = Watchers::start(endpoints, p.watchers);
        let compactor = p.compact_every.filter(|_| p.api == Api::Grpc).map(|every| {
            let (stop, stopped) = watch::channel(false);
            let task = super::grpc::compactor(endpoints.to_vec(), every, p.compact_keep, stopped);
            (stop, tokio::spawn(task))
        });
        Load {
            clients,
            watchers,
            compactor,
        }
    }

    /// Stops the clients and the compactor (the watchers go on until the
    /// end): what the clients recorded, the watchers, and the revisions
    /// of the compactions asked for.
    pub async fn stop(
        self,
        events: &mut Vec<String>,
        stamp: &dyn Fn(&str) -> String,
    ) -> Result<Recorded, String> {
        let recs = self.clients.stop().await?;
        let mut compactions = Vec::new();
        if let Some((stop, task)) = self.compactor {
            let _ = stop.send(true);
            let asked = task.await.map_err(|e| e.to_string())?;
            let acked = asked.iter().filter(|a| a.1).count();
            events.push(stamp(&format!(
                "{} compactions asked for, {acked} acknowledged, the last at {}",
                asked.len(),
                asked.last().map_or(0, |a| a.0)
            )));
            compactions = asked.into_iter().map(|a| a.0).collect();
        }
        Ok(Recorded {
            recs,
            watchers: self.watchers,
            compactions,
        })
    }
}

/// What a run's load recorded, its watchers still at work.
pub(super) struct Recorded {
    /// The clients' records.
    pub recs: Vec<Rec>,
    /// The watchers, still at work.
    pub watchers: Watchers,
    /// The revisions of the compactions asked for.
    pub compactions: Vec<i64>,
}
