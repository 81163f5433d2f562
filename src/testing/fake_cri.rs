//! `FakeCri`: an in-memory actor that answers the CRI gateway's messages
//! (`ListImages`, `ListContainers`, `GetImageStatus`, `RemoveImage`,
//! `GetImageFsInfo`) at once, counts them, and can fail the next call of a
//! kind. Hand its `Recipient`s to an actor under test.

use std::collections::BTreeMap;
use std::time::SystemTime;

use actix::prelude::*;

use crate::actors::cri_gateway::{
    GetImageFsInfo, GetImageStatus, ListContainers, ListImages, ListPodSandboxes, RemoveImage,
};
use crate::cri::{CriError, Rpc};
use crate::domain::{Container, FilesystemUsage, Image, ImageFsInfo, ImageStatus, PodSandbox};

/// Calls received, per kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeCriCalls {
    /// Calls per RPC.
    pub calls: BTreeMap<Rpc, u64>,
    /// Images removed, in order.
    pub removed: Vec<String>,
}

impl FakeCriCalls {
    /// Calls of one kind.
    pub fn of(&self, rpc: Rpc) -> u64 {
        self.calls.get(&rpc).copied().unwrap_or(0)
    }
}

/// The fake. `capacity` and the image sizes make up the filesystem.
#[derive(Debug, Default)]
pub struct FakeCri {
    images: Vec<Image>,
    containers: Vec<Container>,
    sandboxes: Vec<PodSandbox>,
    capacity: u64,
    /// Bytes used by other things than images.
    other_used: u64,
    calls: FakeCriCalls,
    fail_next: BTreeMap<Rpc, CriError>,
}

impl FakeCri {
    /// A fake with these images and a filesystem of `capacity` bytes.
    pub fn new(images: Vec<Image>, capacity: u64) -> Self {
        Self { images, capacity, ..Self::default() }
    }

    fn count(&mut self, rpc: Rpc) -> Result<(), CriError> {
        *self.calls.calls.entry(rpc).or_default() += 1;
        match self.fail_next.remove(&rpc) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn used(&self) -> u64 {
        self.images.iter().map(|i| i.size).sum::<u64>() + self.other_used
    }

    /// Available bytes on the fake filesystem.
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.used())
    }
}

impl Actor for FakeCri {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(1024);
    }
}

impl Handler<ListImages> for FakeCri {
    type Result = Result<Vec<Image>, CriError>;
    fn handle(&mut self, _: ListImages, _: &mut Self::Context) -> Self::Result {
        self.count(Rpc::ListImages)?;
        Ok(self.images.clone())
    }
}

impl Handler<ListContainers> for FakeCri {
    type Result = Result<Vec<Container>, CriError>;
    fn handle(&mut self, _: ListContainers, _: &mut Self::Context) -> Self::Result {
        self.count(Rpc::ListContainers)?;
        Ok(self.containers.clone())
    }
}

impl Handler<ListPodSandboxes> for FakeCri {
    type Result = Result<Vec<PodSandbox>, CriError>;
    fn handle(&mut self, _: ListPodSandboxes, _: &mut Self::Context) -> Self::Result {
        self.count(Rpc::ListPodSandbox)?;
        Ok(self.sandboxes.clone())
    }
}

impl Handler<GetImageStatus> for FakeCri {
    type Result = Result<ImageStatus, CriError>;
    fn handle(&mut self, m: GetImageStatus, _: &mut Self::Context) -> Self::Result {
        self.count(Rpc::ImageStatus)?;
        let want = m.image.image;
        let image = self
            .images
            .iter()
            .find(|i| i.id == want || i.repo_tags.contains(&want) || i.repo_digests.contains(&want))
            .cloned();
        Ok(ImageStatus { image, info: BTreeMap::new() })
    }
}

impl Handler<RemoveImage> for FakeCri {
    type Result = Result<(), CriError>;
    fn handle(&mut self, m: RemoveImage, _: &mut Self::Context) -> Self::Result {
        self.count(Rpc::RemoveImage)?;
        let want = m.image.image;
        self.images.retain(|i| !(i.id == want || i.repo_tags.contains(&want)));
        self.calls.removed.push(want);
        Ok(())
    }
}

impl Handler<GetImageFsInfo> for FakeCri {
    type Result = Result<ImageFsInfo, CriError>;
    fn handle(&mut self, _: GetImageFsInfo, _: &mut Self::Context) -> Self::Result {
        self.count(Rpc::ImageFsInfo)?;
        let usage = FilesystemUsage {
            timestamp: SystemTime::now(),
            mountpoint: "/fake".into(),
            used_bytes: Some(self.used()),
            inodes_used: Some(self.images.len() as u64),
        };
        Ok(ImageFsInfo { image_filesystems: vec![usage.clone()], container_filesystems: vec![usage] })
    }
}

/// Replaces the fake's images.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SetFakeImages(pub Vec<Image>);

impl Handler<SetFakeImages> for FakeCri {
    type Result = ();
    fn handle(&mut self, m: SetFakeImages, _: &mut Self::Context) {
        self.images = m.0;
    }
}

/// Replaces the fake's containers (and their pod sandboxes).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SetFakeContainers(pub Vec<Container>, pub Vec<PodSandbox>);

impl Handler<SetFakeContainers> for FakeCri {
    type Result = ();
    fn handle(&mut self, m: SetFakeContainers, _: &mut Self::Context) {
        self.containers = m.0;
        self.sandboxes = m.1;
    }
}

impl FakeCri {
    /// The recipients a detector needs.
    pub fn detector_cri(addr: &Addr<FakeCri>) -> crate::actors::detector::DetectorCri {
        crate::actors::detector::DetectorCri {
            list_images: addr.clone().recipient(),
            list_containers: addr.clone().recipient(),
            list_sandboxes: addr.clone().recipient(),
            image_status: addr.clone().recipient(),
        }
    }
}

/// Sets the filesystem: capacity and bytes used by things other than images.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SetFakeFs {
    /// Capacity in bytes.
    pub capacity: u64,
    /// Bytes used by non-image data.
    pub other_used: u64,
}

impl Handler<SetFakeFs> for FakeCri {
    type Result = ();
    fn handle(&mut self, m: SetFakeFs, _: &mut Self::Context) {
        self.capacity = m.capacity;
        self.other_used = m.other_used;
    }
}

/// Fails the next call of one kind with this error.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct FailNext(pub Rpc, pub CriError);

impl Handler<FailNext> for FakeCri {
    type Result = ();
    fn handle(&mut self, m: FailNext, _: &mut Self::Context) {
        self.fail_next.insert(m.0, m.1);
    }
}

/// Reads the calls so far.
#[derive(Debug, Message)]
#[rtype(result = "FakeCriCalls")]
pub struct GetFakeCalls;

impl Handler<GetFakeCalls> for FakeCri {
    type Result = MessageResult<GetFakeCalls>;
    fn handle(&mut self, _: GetFakeCalls, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.calls.clone())
    }
}
