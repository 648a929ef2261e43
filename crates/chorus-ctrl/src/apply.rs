//! [`Meta::apply`] and [`Meta::check`]: each command's validation and effect.
//!
//! Every control node replays the control log through `apply`, so it must reach the same
//! state on every node (PolarFS section 3.2.3, duty 2, with the log in place of
//! PolarCtrl's metadata database): it depends only on the state and the command, and a
//! command it refuses is a no-op everywhere alike.

use std::collections::BTreeSet;

use crate::meta::{
    check_geometry, check_name, check_node_fields, check_snapshot_name, Chunk, Command, GroupId,
    Meta, MetaError, Move, Node, NodeId, NodeState, Snapshot, SnapshotState, Volume, VolumeState,
};

impl Meta {
    /// Applies the command at log position `pos`.
    ///
    /// `pos` must be after [`Meta::applied`] (positions count from 1, so that 0 can mean
    /// "nothing applied"; for a log addressed by byte offset, pass the entry's end
    /// offset): an earlier one is a replay of an applied entry and is refused with
    /// [`MetaError::Replayed`], changing nothing.
    ///
    /// Otherwise `applied` becomes `pos` whether or not the command is accepted. The
    /// control leader [`Meta::check`]s a command before appending it, but an entry
    /// appended concurrently before it may make it invalid by the time it applies (a
    /// second `CreateVolume` of the same name, a `StartMove` onto a node just drained);
    /// then every control node refuses it alike, and the refusal is the command's
    /// outcome: nothing else changes.
    pub fn apply(&mut self, pos: u64, cmd: &Command) -> Result<(), MetaError> {
        if pos <= self.applied {
            return Err(MetaError::Replayed {
                pos,
                applied: self.applied,
            });
        }
        self.applied = pos;
        self.check(cmd)?;
        self.effect(cmd);
        Ok(())
    }

    /// Whether [`Meta::apply`] would accept `cmd` now; changes nothing.
    pub fn check(&self, cmd: &Command) -> Result<(), MetaError> {
        match cmd {
            Command::RegisterNode {
                id,
                repl_addr,
                client_addr,
                rack,
            } => {
                check_node_fields(*id, repl_addr, client_addr, rack)?;
                match self.nodes.get(id) {
                    Some(n) if n.state == NodeState::Removed => {
                        Err(MetaError::NodeRemoved { id: *id })
                    }
                    _ => Ok(()),
                }
            }
            Command::SetNodeState { id, .. } => self.live_node(*id).map(|_| ()),
            Command::CreateVolume {
                name,
                size_bytes,
                chunk_bytes,
                block_bytes,
                chunks,
            } => {
                check_name(name)?;
                if self.volumes.contains_key(name) {
                    return Err(MetaError::VolumeExists { name: name.clone() });
                }
                check_geometry(*size_bytes, *chunk_bytes, *block_bytes)?;
                self.check_new_chunks(chunks, size_bytes.div_ceil(*chunk_bytes))
            }
            Command::VolumeReady { name } => self
                .volume_in(name, &[VolumeState::Creating], "creating")
                .map(|_| ()),
            Command::GrowVolume {
                name,
                size_bytes,
                chunks,
            } => {
                let v = self.volume_in(name, &[VolumeState::Ready], "ready")?;
                if *size_bytes <= v.size_bytes {
                    return Err(MetaError::NotLarger {
                        name: name.clone(),
                        size_bytes: v.size_bytes,
                        requested_bytes: *size_bytes,
                    });
                }
                // The volume invariant gives `chunks.len() == ceil(size / chunk_bytes)`,
                // so the new total is never below the current count.
                let total = size_bytes.div_ceil(v.chunk_bytes);
                let more = total.saturating_sub(v.chunks.len() as u64);
                self.check_new_chunks(chunks, more)
            }
            Command::DeleteVolume { name } => {
                self.volume_in(
                    name,
                    &[VolumeState::Creating, VolumeState::Ready],
                    "creating or ready",
                )?;
                // Its chunks hold the snapshot a clone is being copied from.
                match self.clone_copying(name, None) {
                    Some((clone, id)) => Err(MetaError::SnapshotInUse {
                        volume: name.clone(),
                        id,
                        clone: clone.name.clone(),
                    }),
                    None => Ok(()),
                }
            }
            Command::VolumeGone { name } => self
                .volume_in(name, &[VolumeState::Deleting], "deleting")
                .map(|_| ()),
            Command::StartMove { group, from, to } => {
                let c = self.chunk_in_service(*group)?;
                if c.moving.is_some() {
                    return Err(MetaError::Moving { group: *group });
                }
                if !c.replicas.contains(from) {
                    return Err(MetaError::NotAReplica {
                        group: *group,
                        node: *from,
                    });
                }
                let n = self.live_node(*to)?;
                if n.state != NodeState::Up {
                    return Err(MetaError::NodeNotUp {
                        id: *to,
                        state: n.state,
                    });
                }
                if c.replicas.contains(to) {
                    return Err(MetaError::AlreadyReplica {
                        group: *group,
                        node: *to,
                    });
                }
                Ok(())
            }
            Command::FinishMove { group, from, to } => {
                // Allowed in every volume state: it concludes a move started legitimately,
                // and a deleting volume's map may as well stay true.
                let c = self.existing_chunk(*group)?;
                let Some(m) = c.moving else {
                    return Err(MetaError::NotMoving { group: *group });
                };
                if m.from != *from || m.to != *to {
                    return Err(MetaError::MoveMismatch {
                        group: *group,
                        from: *from,
                        to: *to,
                        moving: m,
                    });
                }
                // A destination removed meanwhile must not become a voter; the mover
                // aborts instead.
                self.live_node(*to).map(|_| ())
            }
            Command::AbortMove { group } => match self.existing_chunk(*group)?.moving {
                Some(_) => Ok(()),
                None => Err(MetaError::NotMoving { group: *group }),
            },
            Command::SetPreferredLeader { group, node } => {
                let c = self.chunk_in_service(*group)?;
                if !c.replicas.contains(node) {
                    return Err(MetaError::NotAReplica {
                        group: *group,
                        node: *node,
                    });
                }
                Ok(())
            }
            Command::CreateSnapshot { volume, name } => {
                let v = self.volume_in(volume, &[VolumeState::Ready], "ready")?;
                check_snapshot_name(name)?;
                if v.snapshot_named(name).is_some() {
                    return Err(MetaError::SnapshotExists {
                        volume: volume.clone(),
                        name: name.clone(),
                    });
                }
                if let Some(s) = v.creating_snapshot() {
                    return Err(MetaError::SnapshotInProgress {
                        volume: volume.clone(),
                        id: s.id,
                    });
                }
                // Keeps every id below next_snapshot.
                if self.next_snapshot == u64::MAX {
                    return Err(MetaError::SnapshotIdsExhausted);
                }
                Ok(())
            }
            Command::SnapshotReady { volume, id } => {
                let v = self.volume_in(volume, &[VolumeState::Ready], "ready")?;
                snapshot_in(v, *id, SnapshotState::Creating, "creating").map(|_| ())
            }
            Command::DeleteSnapshot { volume, id } => {
                let v = self.volume_in(volume, &[VolumeState::Ready], "ready")?;
                snapshot_in(v, *id, SnapshotState::Ready, "ready")?;
                match self.clone_copying(volume, Some(*id)) {
                    Some((clone, _)) => Err(MetaError::SnapshotInUse {
                        volume: volume.clone(),
                        id: *id,
                        clone: clone.name.clone(),
                    }),
                    None => Ok(()),
                }
            }
            Command::SnapshotGone { volume, id } => {
                // Any volume state: a deleting volume's snapshot may finish going.
                let v = self
                    .volumes
                    .get(volume)
                    .ok_or_else(|| MetaError::NoSuchVolume {
                        name: volume.clone(),
                    })?;
                snapshot_in(v, *id, SnapshotState::Deleting, "deleting").map(|_| ())
            }
            Command::CloneVolume {
                name,
                source,
                snapshot,
                chunks,
            } => {
                check_name(name)?;
                if self.volumes.contains_key(name) {
                    return Err(MetaError::VolumeExists { name: name.clone() });
                }
                let src = self.volume_in(source, &[VolumeState::Ready], "ready")?;
                snapshot_in(src, *snapshot, SnapshotState::Ready, "ready")?;
                self.check_new_chunks(chunks, src.size_bytes.div_ceil(src.chunk_bytes))
            }
        }
    }

    /// Applies an accepted command's effect. Called only after [`Meta::check`] passed, so
    /// every lookup succeeds; each is still written not to panic.
    fn effect(&mut self, cmd: &Command) {
        match cmd {
            Command::RegisterNode {
                id,
                repl_addr,
                client_addr,
                rack,
            } => {
                let state = self.nodes.get(id).map_or(NodeState::Up, |n| n.state);
                self.nodes.insert(
                    *id,
                    Node {
                        id: *id,
                        repl_addr: repl_addr.clone(),
                        client_addr: client_addr.clone(),
                        rack: rack.clone(),
                        state,
                    },
                );
            }
            Command::SetNodeState { id, state } => {
                if let Some(n) = self.nodes.get_mut(id) {
                    n.state = *state;
                }
            }
            Command::CreateVolume {
                name,
                size_bytes,
                chunk_bytes,
                block_bytes,
                chunks,
            } => {
                self.take_groups(name, 0, chunks);
                self.volumes.insert(
                    name.clone(),
                    Volume {
                        name: name.clone(),
                        size_bytes: *size_bytes,
                        chunk_bytes: *chunk_bytes,
                        block_bytes: *block_bytes,
                        chunks: chunks.clone(),
                        version: 1,
                        state: VolumeState::Creating,
                        snapshots: Vec::new(),
                        source: None,
                    },
                );
            }
            Command::VolumeReady { name } => {
                // Not a change to the chunk map: the version stays. A clone's copy is
                // done: it no longer holds its source snapshot.
                if let Some(v) = self.volumes.get_mut(name) {
                    v.state = VolumeState::Ready;
                    v.source = None;
                }
            }
            Command::GrowVolume {
                name,
                size_bytes,
                chunks,
            } => {
                let first = self.volumes.get(name).map_or(0, |v| v.chunks.len());
                self.take_groups(name, first, chunks);
                if let Some(v) = self.volumes.get_mut(name) {
                    v.size_bytes = *size_bytes;
                    v.chunks.extend(chunks.iter().cloned());
                    v.version = v.version.saturating_add(1);
                }
            }
            Command::DeleteVolume { name } => {
                // A version step, so that clients caching the map learn it is going.
                // A clone's copy stops: it no longer holds its source snapshot. The
                // volume's own snapshots stay until VolumeGone.
                if let Some(v) = self.volumes.get_mut(name) {
                    v.state = VolumeState::Deleting;
                    v.version = v.version.saturating_add(1);
                    v.source = None;
                }
            }
            Command::VolumeGone { name } => {
                // next_group and next_snapshot stay: group and snapshot ids are never
                // reused. The volume's snapshots go with it.
                if let Some(v) = self.volumes.remove(name) {
                    for c in &v.chunks {
                        self.groups.remove(&c.group);
                    }
                }
            }
            Command::StartMove { group, from, to } => {
                self.edit_chunk(*group, |c| {
                    c.moving = Some(Move {
                        from: *from,
                        to: *to,
                    });
                    true
                });
            }
            Command::FinishMove { group, from, to } => {
                self.edit_chunk(*group, |c| {
                    if let Some(slot) = c.replicas.iter_mut().find(|r| **r == *from) {
                        *slot = *to;
                    }
                    c.moving = None;
                    true
                });
            }
            Command::AbortMove { group } => {
                self.edit_chunk(*group, |c| {
                    c.moving = None;
                    true
                });
            }
            Command::SetPreferredLeader { group, node } => {
                self.edit_chunk(*group, |c| {
                    match c.replicas.iter().position(|r| r == node) {
                        // Already preferred: no change, so no version step.
                        Some(0) | None => false,
                        Some(i) => {
                            c.replicas[..=i].rotate_right(1);
                            true
                        }
                    }
                });
            }
            Command::CreateSnapshot { volume, name } => {
                let id = self.next_snapshot;
                if let Some(v) = self.volumes.get_mut(volume) {
                    // Ids only grow, so the list stays ascending.
                    v.snapshots.push(Snapshot {
                        id,
                        name: name.clone(),
                        state: SnapshotState::Creating,
                    });
                    // Clients must learn the write tag (PolarFS section 7.2).
                    v.version = v.version.saturating_add(1);
                    // check refused u64::MAX, so this cannot saturate.
                    self.next_snapshot = id.saturating_add(1);
                }
            }
            Command::SnapshotReady { volume, id } => {
                // Clients must learn to stop tagging.
                self.edit_snapshot(volume, *id, SnapshotState::Ready, true);
            }
            Command::DeleteSnapshot { volume, id } => {
                self.edit_snapshot(volume, *id, SnapshotState::Deleting, false);
            }
            Command::SnapshotGone { volume, id } => {
                if let Some(v) = self.volumes.get_mut(volume) {
                    v.snapshots.retain(|s| s.id != *id);
                }
            }
            Command::CloneVolume {
                name,
                source,
                snapshot,
                chunks,
            } => {
                let Some(src) = self.volumes.get(source) else {
                    return;
                };
                let clone = Volume {
                    name: name.clone(),
                    size_bytes: src.size_bytes,
                    chunk_bytes: src.chunk_bytes,
                    block_bytes: src.block_bytes,
                    chunks: chunks.clone(),
                    version: 1,
                    state: VolumeState::Creating,
                    snapshots: Vec::new(),
                    source: Some((source.clone(), *snapshot)),
                };
                self.take_groups(name, 0, chunks);
                self.volumes.insert(name.clone(), clone);
            }
        }
    }

    /// Sets a snapshot's state, stepping its volume's version if `step`.
    fn edit_snapshot(&mut self, volume: &str, id: u64, state: SnapshotState, step: bool) {
        let Some(v) = self.volumes.get_mut(volume) else {
            return;
        };
        if let Some(s) = v.snapshots.iter_mut().find(|s| s.id == id) {
            s.state = state;
            if step {
                v.version = v.version.saturating_add(1);
            }
        }
    }

    /// A registered node that is not removed.
    fn live_node(&self, id: NodeId) -> Result<&Node, MetaError> {
        match self.nodes.get(&id) {
            None => Err(MetaError::NoSuchNode { id }),
            Some(n) if n.state == NodeState::Removed => Err(MetaError::NodeRemoved { id }),
            Some(n) => Ok(n),
        }
    }

    /// A volume in one of `states` (`wanted` names them for the error).
    fn volume_in(
        &self,
        name: &str,
        states: &[VolumeState],
        wanted: &'static str,
    ) -> Result<&Volume, MetaError> {
        let v = self
            .volumes
            .get(name)
            .ok_or_else(|| MetaError::NoSuchVolume {
                name: name.to_string(),
            })?;
        if !states.contains(&v.state) {
            return Err(MetaError::WrongState {
                name: name.to_string(),
                state: v.state,
                wanted,
            });
        }
        Ok(v)
    }

    /// A chunk of any volume.
    fn existing_chunk(&self, group: GroupId) -> Result<&Chunk, MetaError> {
        self.chunk(group)
            .map(|(_, _, c)| c)
            .ok_or(MetaError::NoSuchChunk { group })
    }

    /// A chunk of a volume not being deleted (there is no point moving or re-leading a
    /// chunk about to be destroyed).
    fn chunk_in_service(&self, group: GroupId) -> Result<&Chunk, MetaError> {
        let (v, _, c) = self.chunk(group).ok_or(MetaError::NoSuchChunk { group })?;
        if v.state == VolumeState::Deleting {
            return Err(MetaError::WrongState {
                name: v.name.clone(),
                state: v.state,
                wanted: "creating or ready",
            });
        }
        Ok(c)
    }

    /// Checks chunks a command adds: `want` of them, not moving, each group new (at least
    /// [`Meta::next_group`], distinct, below `u64::MAX` so that the next one exists), each
    /// replica list valid and on nodes not removed.
    fn check_new_chunks(&self, chunks: &[Chunk], want: u64) -> Result<(), MetaError> {
        let bad = |detail: String| Err(MetaError::BadChunks { detail });
        if chunks.len() as u64 != want {
            return bad(format!(
                "{} chunks given, the size needs {want}",
                chunks.len()
            ));
        }
        let mut groups = BTreeSet::new();
        for c in chunks {
            if c.group < self.next_group {
                return bad(format!(
                    "chunk group {} is below the next free group {}",
                    c.group, self.next_group
                ));
            }
            if c.group == GroupId::MAX {
                return bad(format!("chunk group {} is reserved", c.group));
            }
            if !groups.insert(c.group) {
                return bad(format!("chunk group {} is given twice", c.group));
            }
            if c.moving.is_some() {
                return bad(format!("new chunk group {} is already moving", c.group));
            }
            self.check_replicas(c)?;
            for &r in &c.replicas {
                self.live_node(r)?;
            }
        }
        Ok(())
    }

    /// Indexes new chunks (`chunks`, from index `first` of volume `name`) and moves
    /// `next_group` past them.
    fn take_groups(&mut self, name: &str, first: usize, chunks: &[Chunk]) {
        for (i, c) in chunks.iter().enumerate() {
            self.groups.insert(c.group, (name.to_string(), first + i));
            // check_new_chunks refused GroupId::MAX, so this cannot saturate.
            self.next_group = self.next_group.max(c.group.saturating_add(1));
        }
    }

    /// Edits a chunk in place; if `f` reports a change, steps its volume's version.
    fn edit_chunk(&mut self, group: GroupId, f: impl FnOnce(&mut Chunk) -> bool) {
        let Some((name, index)) = self.groups.get(&group) else {
            return;
        };
        let Some(v) = self.volumes.get_mut(name) else {
            return;
        };
        let Some(c) = v.chunks.get_mut(*index) else {
            return;
        };
        if f(c) {
            v.version = v.version.saturating_add(1);
        }
    }
}

/// A snapshot of `v` in state `state` (`wanted` names it for the error).
fn snapshot_in<'a>(
    v: &'a Volume,
    id: u64,
    state: SnapshotState,
    wanted: &'static str,
) -> Result<&'a Snapshot, MetaError> {
    let s = v.snapshot(id).ok_or_else(|| MetaError::NoSuchSnapshot {
        volume: v.name.clone(),
        id,
    })?;
    if s.state != state {
        return Err(MetaError::SnapshotWrongState {
            volume: v.name.clone(),
            id,
            state: s.state,
            wanted,
        });
    }
    Ok(s)
}
