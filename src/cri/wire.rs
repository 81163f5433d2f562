//! CRI messages as bytes on the wire, for a front that forwards them: prost
//! drops fields it does not know when it decodes, so a message that passes
//! through imaged is kept as the bytes the peer sent, read only where imaged
//! needs a value, and changed only where imaged changes it (an `Image`'s
//! `pinned`), every other field, known or not, copied as it came.

use prost::Message as _;
use prost::bytes::{BufMut as _, Bytes, BytesMut};

use super::proto as pb;

/// Bytes that are not a well-formed protobuf message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed protobuf message: {0}")]
pub struct WireError(&'static str);

/// One field of a message: its number, wire type, the whole field's bytes
/// (tag included) and, for length-delimited fields, the payload's range.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    number: u32,
    wire_type: u8,
    whole: std::ops::Range<usize>,
    payload: std::ops::Range<usize>,
}

const LEN: u8 = 2;

fn varint(buf: &[u8], at: &mut usize) -> Result<u64, WireError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*at).ok_or(WireError("truncated varint"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(WireError("varint longer than 10 bytes"))
}

fn put_varint(out: &mut BytesMut, mut v: u64) {
    // Seven bits at a time, low first: each `as u8` keeps exactly them.
    #[allow(clippy::cast_possible_truncation)]
    while v >= 0x80 {
        out.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)]
    out.put_u8(v as u8);
}

/// The top-level fields of `buf`, in order.
fn fields(buf: &[u8]) -> Result<Vec<Field>, WireError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let start = at;
        let tag = varint(buf, &mut at)?;
        let number = u32::try_from(tag >> 3).map_err(|_| WireError("field number out of range"))?;
        if number == 0 {
            return Err(WireError("field number 0"));
        }
        let wire_type = (tag & 7) as u8;
        let payload_start;
        match wire_type {
            0 => {
                varint(buf, &mut at)?;
                payload_start = start;
            }
            1 | 5 => {
                let n = if wire_type == 1 { 8 } else { 4 };
                payload_start = at;
                at = at.checked_add(n).filter(|end| *end <= buf.len()).ok_or(WireError("truncated fixed field"))?;
            }
            LEN => {
                let len = usize::try_from(varint(buf, &mut at)?).map_err(|_| WireError("length out of range"))?;
                payload_start = at;
                at = at.checked_add(len).filter(|end| *end <= buf.len()).ok_or(WireError("truncated field"))?;
            }
            _ => return Err(WireError("unsupported wire type (groups are not used by CRI)")),
        }
        out.push(Field { number, wire_type, whole: start..at, payload: payload_start..at });
    }
    Ok(out)
}

/// `Image.pinned` is field 8, a varint: appending `pinned = true` to an
/// image's bytes sets it (the last value of a scalar field wins), whatever
/// the runtime wrote before.
const PINNED_TRUE: [u8; 2] = [8 << 3, 1];

/// What deciding a pin reads of an `Image`: its names and its `pinned`
/// flag (the same field numbers; every other field is skipped unread, which
/// on a `ListImages` of thousands of images is most of the work saved).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageNames {
    /// `Image.id`.
    #[prost(string, tag = "1")]
    pub id: String,
    /// `Image.repo_tags`.
    #[prost(string, repeated, tag = "2")]
    pub repo_tags: Vec<String>,
    /// `Image.repo_digests`.
    #[prost(string, repeated, tag = "3")]
    pub repo_digests: Vec<String>,
    /// `Image.pinned`.
    #[prost(bool, tag = "8")]
    pub pinned: bool,
}

/// Rewrites the `Image` messages in field `field` of the message `buf`
/// (`ListImagesResponse.images` and `ImageStatusResponse.image` are both
/// field 1): each image for which `pin` says so gets `pinned = true` (never
/// cleared); every other byte is kept. Returns `buf` itself when no image
/// changes.
pub fn pin_images(buf: Bytes, field: u32, pin: impl Fn(&ImageNames) -> bool) -> Result<Bytes, WireError> {
    let fields = fields(&buf)?;
    let mut changed = Vec::new();
    for f in fields.iter().filter(|f| f.number == field && f.wire_type == LEN) {
        let image = ImageNames::decode(&buf[f.payload.clone()]).map_err(|_| WireError("an image does not decode"))?;
        if !image.pinned && pin(&image) {
            changed.push(f);
        }
    }
    if changed.is_empty() {
        return Ok(buf);
    }
    let mut out = BytesMut::with_capacity(buf.len() + changed.len() * (PINNED_TRUE.len() + 2));
    let mut copied = 0;
    for f in changed {
        out.extend_from_slice(&buf[copied..f.whole.start]);
        put_varint(&mut out, (u64::from(field) << 3) | u64::from(LEN));
        put_varint(&mut out, (f.payload.len() + PINNED_TRUE.len()) as u64);
        out.extend_from_slice(&buf[f.payload.clone()]);
        out.extend_from_slice(&PINNED_TRUE);
        copied = f.whole.end;
    }
    out.extend_from_slice(&buf[copied..]);
    Ok(out.freeze())
}

/// Splits the message `buf` into messages of the same type holding at most
/// `per_message` (at least 1) of its fields numbered `field` each, in order,
/// every other field in the first one: a `ListImagesResponse`'s bytes as
/// `StreamImagesResponse`s (both keep their images in field 1). Each field's
/// bytes are kept as they are. At least one message, even for an empty `buf`.
pub fn split_repeated(buf: &Bytes, field: u32, per_message: usize) -> Result<Vec<Bytes>, WireError> {
    let per_message = per_message.max(1);
    let fields = fields(buf)?;
    let mut first = BytesMut::new();
    for f in fields.iter().filter(|f| f.number != field) {
        first.extend_from_slice(&buf[f.whole.clone()]);
    }
    let repeated: Vec<&Field> = fields.iter().filter(|f| f.number == field).collect();
    let mut out = Vec::with_capacity(repeated.len().div_ceil(per_message).max(1));
    let mut chunks = repeated.chunks(per_message);
    if let Some(chunk) = chunks.next() {
        for f in chunk {
            first.extend_from_slice(&buf[f.whole.clone()]);
        }
    }
    out.push(first.freeze());
    for chunk in chunks {
        let mut m = BytesMut::with_capacity(chunk.iter().map(|f| f.whole.len()).sum());
        for f in chunk {
            m.extend_from_slice(&buf[f.whole.clone()]);
        }
        out.push(m.freeze());
    }
    Ok(out)
}

/// `PullImageRequest.auth` is field 2 and `AuthConfig.server_address` its
/// field 4 (a string).
const PULL_AUTH: u32 = 2;
const AUTH_SERVER_ADDRESS: u64 = 4;

/// A client's `PullImageRequest` as the runtime is to get it: every byte
/// kept, except that an `auth.server_address` without a scheme gets one
/// ([`super::convert::server_address_for_runtime`]: containerd 1.6 refuses
/// a bare host). The new value is appended to the last `auth` field (the
/// last value of a scalar field wins, and message fields merge). Returns
/// `buf` itself when nothing changes.
pub fn pull_request_for_runtime(buf: Bytes) -> Result<Bytes, WireError> {
    let req: pb::PullImageRequest = peek(&buf)?;
    let Some(addr) = req.auth.map(|a| a.server_address) else { return Ok(buf) };
    let fixed = super::convert::server_address_for_runtime(&addr);
    if fixed == addr {
        return Ok(buf);
    }
    let fields = fields(&buf)?;
    let Some(last) = fields.iter().rev().find(|f| f.number == PULL_AUTH && f.wire_type == LEN) else {
        return Ok(buf);
    };
    let mut extra = BytesMut::new();
    put_varint(&mut extra, (AUTH_SERVER_ADDRESS << 3) | u64::from(LEN));
    put_varint(&mut extra, fixed.len() as u64);
    extra.extend_from_slice(fixed.as_bytes());
    let mut out = BytesMut::with_capacity(buf.len() + extra.len() + 4);
    out.extend_from_slice(&buf[..last.whole.start]);
    put_varint(&mut out, (u64::from(PULL_AUTH) << 3) | u64::from(LEN));
    put_varint(&mut out, (last.payload.len() + extra.len()) as u64);
    out.extend_from_slice(&buf[last.payload.clone()]);
    out.extend_from_slice(&extra);
    out.extend_from_slice(&buf[last.whole.end..]);
    Ok(out.freeze())
}

/// A gRPC codec whose messages are their encoded bytes: what a front
/// forwards is never decoded and re-encoded on the way through.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

/// [`BytesCodec`]'s encoder and decoder.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCoder;

impl tonic::codec::Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesCoder;
    type Decoder = BytesCoder;

    fn encoder(&mut self) -> Self::Encoder {
        BytesCoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesCoder
    }
}

impl tonic::codec::Encoder for BytesCoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        super::transport::message_buffers()
    }
}

impl tonic::codec::Decoder for BytesCoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        use prost::bytes::Buf as _;
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        super::transport::message_buffers()
    }
}

/// Decodes `buf` as `M` (unknown fields skipped), for the values imaged
/// reads from a message it forwards as bytes.
pub fn peek<M: prost::Message + Default>(buf: &[u8]) -> Result<M, WireError> {
    M::decode(buf).map_err(|_| WireError("does not decode as the CRI message"))
}

#[cfg(test)]
#[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
mod tests {
    use super::*;

    fn image(id: &str, tag: &str, pinned: bool) -> pb::Image {
        pb::Image { id: id.into(), repo_tags: vec![tag.into()], size: 7, pinned, ..Default::default() }
    }

    #[test]
    fn a_list_answer_splits_into_stream_answers_keeping_every_byte() {
        let images: Vec<pb::Image> =
            (0..5).map(|i| image(&format!("sha256:{i}"), &format!("r/{i}:1"), false)).collect();
        let list = Bytes::from(with_unknown(&pb::ListImagesResponse { images: images.clone() }, "extra"));
        let parts = split_repeated(&list, 1, 2).unwrap();
        assert_eq!(parts.len(), 3);
        let got: Vec<Vec<pb::Image>> =
            parts.iter().map(|p| peek::<pb::StreamImagesResponse>(p).unwrap().images).collect();
        assert_eq!(got, [images[0..2].to_vec(), images[2..4].to_vec(), images[4..].to_vec()]);
        // The unknown field travels in the first message; nothing is lost.
        assert!(parts[0].windows(5).any(|w| w == b"extra"));
        assert_eq!(parts.iter().map(Bytes::len).sum::<usize>(), list.len());
        // An empty list is one empty message.
        assert_eq!(split_repeated(&Bytes::new(), 1, 2).unwrap(), [Bytes::new()]);
        assert!(split_repeated(&Bytes::from_static(&[0x0a, 0x05]), 1, 2).is_err());
    }

    /// `msg` with an extra field a newer peer might send (number 99, a string).
    fn with_unknown(msg: &impl prost::Message, text: &str) -> Vec<u8> {
        let mut b = msg.encode_to_vec();
        b.extend_from_slice(&[0x9a, 0x06, text.len() as u8]); // field 99, LEN
        b.extend_from_slice(text.as_bytes());
        b
    }

    #[test]
    fn a_bare_server_address_gets_a_scheme_and_every_other_byte_stays() {
        let auth = pb::AuthConfig {
            username: "u".into(),
            password: "p".into(),
            server_address: "127.0.0.1:5000".into(),
            ..Default::default()
        };
        let mut req = Vec::new();
        let spec = with_unknown(&pb::ImageSpec { image: "127.0.0.1:5000/a:1".into(), ..Default::default() }, "spec");
        req.extend_from_slice(&[0x0a, spec.len() as u8]);
        req.extend_from_slice(&spec);
        let auth = with_unknown(&auth, "auth-extra");
        req.extend_from_slice(&[0x12, auth.len() as u8]);
        req.extend_from_slice(&auth);
        req.extend_from_slice(&[0x9a, 0x06, 3]);
        req.extend_from_slice(b"req");
        let out = pull_request_for_runtime(Bytes::from(req.clone())).expect("rewritten");
        let read: pb::PullImageRequest = peek(&out).expect("decodes");
        let a = read.auth.expect("auth");
        assert_eq!((a.server_address.as_str(), a.username.as_str()), ("https://127.0.0.1:5000", "u"));
        assert_eq!(read.image.as_ref().map(|i| i.image.as_str()), Some("127.0.0.1:5000/a:1"));
        for unknown in [&b"spec"[..], b"auth-extra", b"req"] {
            assert!(out.windows(unknown.len()).any(|w| w == unknown), "{unknown:?} kept");
        }
        // Nothing to change: the same bytes.
        let fine = Bytes::from(pb::PullImageRequest { auth: None, ..read }.encode_to_vec());
        assert_eq!(pull_request_for_runtime(fine.clone()).expect("same"), fine);
        assert!(pull_request_for_runtime(Bytes::from_static(&[0x12, 0x05, 1])).is_err(), "truncated");
    }

    #[test]
    fn pinning_keeps_every_other_byte_including_unknown_fields() {
        let a = with_unknown(&image("sha256:a", "pause:3.10", false), "img-extra");
        let b = image("sha256:b", "nginx:1", false).encode_to_vec();
        let mut resp = Vec::new();
        for img in [&a, &b] {
            resp.push(0x0a);
            resp.push(img.len() as u8);
            resp.extend_from_slice(img);
        }
        resp.extend_from_slice(&[0x9a, 0x06, 4]);
        resp.extend_from_slice(b"resp");

        let out =
            pin_images(Bytes::from(resp.clone()), 1, |i| i.repo_tags.iter().any(|t| t.starts_with("pause"))).unwrap();
        let decoded = pb::ListImagesResponse::decode(out.clone()).unwrap();
        assert_eq!(decoded.images.iter().map(|i| i.pinned).collect::<Vec<_>>(), [true, false]);
        // The unknown fields of the response and of the image are still there.
        assert!(out.windows(9).any(|w| w == b"img-extra"), "{out:?}");
        assert!(out.ends_with(&[0x9a, 0x06, 4, b'r', b'e', b's', b'p']), "{out:?}");
        // The second image's bytes are untouched.
        assert!(out.windows(b.len()).any(|w| w == b.as_slice()));
    }

    #[test]
    fn nothing_to_pin_returns_the_same_bytes_and_true_is_never_cleared() {
        let resp = pb::ImageStatusResponse { image: Some(image("sha256:a", "x:1", true)), ..Default::default() };
        let bytes = Bytes::from(resp.encode_to_vec());
        let out = pin_images(bytes.clone(), 1, |_| false).unwrap();
        assert_eq!(out, bytes);
        let out = pin_images(bytes.clone(), 1, |_| true).unwrap();
        assert_eq!(out, bytes, "already pinned: not rewritten");
        assert!(pb::ImageStatusResponse::decode(out).unwrap().image.unwrap().pinned);
    }

    #[test]
    fn an_empty_status_and_an_empty_list_pass_through() {
        assert_eq!(pin_images(Bytes::new(), 1, |_| true).unwrap(), Bytes::new());
    }

    #[test]
    fn malformed_bytes_are_an_error_not_a_panic() {
        for bad in [&[0x0a, 0x05, 1][..], &[0x80][..], &[0x00, 0x01][..], &[0x0b][..], &[0x0a, 0xff, 0xff, 0xff][..]] {
            assert!(pin_images(Bytes::copy_from_slice(bad), 1, |_| true).is_err(), "{bad:?}");
        }
        assert!(peek::<pb::Image>(&[0x0a, 0x05, 1]).is_err());
    }

    #[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
    mod props {
        use proptest::prelude::*;

        use super::*;
        use crate::testing::props::config;

        fn image() -> impl Strategy<Value = pb::Image> {
            ("\\PC{0,12}", prop::collection::vec("[a-z]{0,6}:[0-9]{0,3}", 0..3), any::<u64>(), any::<bool>()).prop_map(
                |(id, repo_tags, size, pinned)| pb::Image { id, repo_tags, size, pinned, ..Default::default() },
            )
        }

        /// The rule under test: pin images with a tag starting with `p`.
        fn pin(i: &ImageNames) -> bool {
            i.repo_tags.iter().any(|t| t.starts_with('p'))
        }

        fn damage(mut bytes: Vec<u8>, at: prop::sample::Index, byte: u8, cut: prop::sample::Index) -> Vec<u8> {
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            bytes.truncate(cut.index(bytes.len() + 1));
            bytes
        }

        proptest! {
            #![proptest_config(config(256))]

            #[test]
            fn any_bytes_are_an_answer_or_an_error_never_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
                let b = Bytes::from(bytes);
                let _ = pin_images(b.clone(), 1, |_| true);
                let _ = pin_images(b.clone(), 1, |_| false);
                let _ = pull_request_for_runtime(b.clone());
                let _ = peek::<pb::ListImagesResponse>(&b);
                let _ = peek::<pb::PullImageRequest>(&b);
                let _ = peek::<pb::ImageStatusResponse>(&b);
            }

            #[test]
            fn pinning_a_list_sets_exactly_the_chosen_images(images in prop::collection::vec(image(), 0..6)) {
                let resp = pb::ListImagesResponse { images: images.clone() };
                let out = pin_images(Bytes::from(resp.encode_to_vec()), 1, pin).unwrap();
                let got = pb::ListImagesResponse::decode(out).unwrap();
                let want: Vec<pb::Image> = images
                    .into_iter()
                    .map(|mut i| {
                        i.pinned |= i.repo_tags.iter().any(|t| t.starts_with('p'));
                        i
                    })
                    .collect();
                prop_assert_eq!(got.images, want);
            }

            #[test]
            fn a_pull_request_keeps_everything_but_a_bare_server_address(
                image in "\\PC{0,20}",
                username in "\\PC{0,8}",
                server_address in prop_oneof!["[a-z0-9.:]{0,16}", "(https?|oci)://[a-z0-9.:]{0,16}", "\\PC{0,16}"],
                with_auth in any::<bool>(),
            ) {
                let req = pb::PullImageRequest {
                    image: Some(pb::ImageSpec { image, ..Default::default() }),
                    auth: with_auth.then(|| pb::AuthConfig { username, server_address, ..Default::default() }),
                    sandbox_config: None,
                };
                let out = pull_request_for_runtime(Bytes::from(req.encode_to_vec())).unwrap();
                let got = pb::PullImageRequest::decode(out).unwrap();
                let mut want = req;
                if let Some(a) = want.auth.as_mut() {
                    a.server_address = super::super::super::convert::server_address_for_runtime(&a.server_address);
                }
                prop_assert_eq!(got, want);
            }

            #[test]
            fn a_damaged_message_is_an_answer_or_an_error_never_a_panic(
                images in prop::collection::vec(image(), 0..4),
                at in any::<prop::sample::Index>(),
                byte in any::<u8>(),
                cut in any::<prop::sample::Index>(),
            ) {
                let bytes = damage(pb::ListImagesResponse { images }.encode_to_vec(), at, byte, cut);
                if let Ok(out) = pin_images(Bytes::from(bytes.clone()), 1, pin) {
                    // What comes out decodes whenever what went in did.
                    if pb::ListImagesResponse::decode(&bytes[..]).is_ok() {
                        prop_assert!(pb::ListImagesResponse::decode(out).is_ok());
                    }
                }
                let _ = pull_request_for_runtime(Bytes::from(bytes));
            }
        }
    }
}
