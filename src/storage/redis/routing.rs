use super::*;

/// Hash slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16_384;

/// Where hits go. A cluster maps each hash slot to its primary's pool; a
/// single server (standalone, or Sentinel's current primary) is the only
/// node, named once known.
#[derive(Default)]
pub(super) struct Routing {
    /// Cluster only: for each slot, an index into `nodes`, or `UNOWNED`.
    pub(super) slots: Vec<u16>,
    pub(super) nodes: Vec<Arc<NodePool>>,
    /// Single server only: its name, once known.
    pub(super) single: NodeId,
    /// What this was built from, to notice a change cheaply.
    pub(super) source: Vec<(u16, u16, String)>,
    pub(super) built: Option<std::time::Instant>,
}

/// A slot no primary serves in the last `CLUSTER SLOTS`.
pub(super) const UNOWNED: u16 = u16::MAX;

impl Routing {
    /// `pools` holds the pools already open, by server name; they are
    /// reused, and pools for new primaries are opened.
    pub(super) fn cluster(
        state: &ClusterRouting,
        pools: &HashMap<String, Arc<NodePool>>,
        settings: &PoolSettings,
    ) -> Result<Routing, StoreError> {
        let source = Self::cluster_source(state);
        let mut nodes: Vec<Arc<NodePool>> = Vec::new();
        let mut slots = vec![UNOWNED; SLOTS];
        for (range, (start, end, name)) in state.slots().iter().zip(&source) {
            let index = match nodes.iter().position(|n| n.id.name() == Some(name)) {
                Some(index) => index,
                None => {
                    let pool = match pools.get(name) {
                        Some(pool) => pool.clone(),
                        None => Arc::new(settings.open_node(range.primary.clone())?),
                    };
                    nodes.push(pool);
                    nodes.len() - 1
                }
            };
            let (start, end) = (*start as usize, (*end as usize).min(SLOTS - 1));
            if start <= end {
                slots[start..=end].fill(index as u16);
            }
        }
        Ok(Routing {
            slots,
            nodes,
            single: NodeId::SOLE,
            source,
            built: Some(std::time::Instant::now()),
        })
    }

    pub(super) fn cluster_source(state: &ClusterRouting) -> Vec<(u16, u16, String)> {
        state
            .slots()
            .iter()
            .map(|r| (r.start, r.end, r.primary.to_string()))
            .collect()
    }

    /// The pool of the slot's primary, or why there is none.
    pub(super) fn owner_pool(&self, slot: u16) -> Result<Arc<NodePool>, StoreError> {
        match self.slots.get(slot as usize) {
            Some(&index) if index != UNOWNED => Ok(self.nodes[index as usize].clone()),
            _ if self.nodes.is_empty() => Err(StoreError::Unavailable(
                "redis cluster routing not known yet".into(),
            )),
            _ => Err(StoreError::Unavailable(format!(
                "no redis primary serves slot {slot}"
            ))),
        }
    }

    pub(super) fn owner(&self, slot: u16) -> Option<&NodePool> {
        match self.slots.get(slot as usize) {
            Some(&index) if index != UNOWNED => Some(&self.nodes[index as usize]),
            _ => None,
        }
    }
}
