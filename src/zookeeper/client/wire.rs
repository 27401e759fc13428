//! ZooKeeper's wire protocol (jute, big-endian, each frame behind its length): the frames of
//! the requests this crate sends, and the reading of their answers.
//!
//! Every length and count read from the server is checked against what is left of its frame
//! before anything is allocated for it: a hostile or broken answer is an error, never a panic
//! or a huge allocation.

use std::fmt;

/// The longest frame read from a server (ZooKeeper's own `jute.maxbuffer` is 1 MiB by
/// default): a longer length is taken for a broken stream.
pub(super) const MAX_FRAME: usize = 16 << 20;

/// The operation codes of the requests this client sends.
pub(super) mod op {
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const CREATE2: i32 = 15;
    pub const CLOSE: i32 = -11;
    pub const AUTH: i32 = 100;
    pub const SET_WATCHES: i32 = 101;
}

/// The reserved request ids of answers that answer no numbered request.
pub(super) mod xid {
    pub const NOTIFICATION: i32 = -1;
    pub const PING: i32 = -2;
    pub const AUTH: i32 = -4;
    pub const SET_WATCHES: i32 = -8;
}

/// A frame being written: a placeholder for its length, then the fields.
pub(super) struct Frame(Vec<u8>);

impl Frame {
    /// A request frame: its length (filled in by [`finish`](Self::finish)), its id and its
    /// operation code.
    pub fn request(xid: i32, opcode: i32) -> Frame {
        let mut frame = Frame(Vec::with_capacity(64));
        frame.0.extend_from_slice(&[0; 4]);
        frame.i32(xid).i32(opcode);
        frame
    }

    /// A frame without a request header (the connect request).
    pub fn bare() -> Frame {
        Frame(vec![0; 4])
    }

    pub fn i32(&mut self, value: i32) -> &mut Self {
        self.0.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub fn i64(&mut self, value: i64) -> &mut Self {
        self.0.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.0.push(u8::from(value));
        self
    }

    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.i32(len_i32(value.len()));
        self.0.extend_from_slice(value);
        self
    }

    pub fn str(&mut self, value: &str) -> &mut Self {
        self.bytes(value.as_bytes())
    }

    pub fn strings<'a>(&mut self, values: impl ExactSizeIterator<Item = &'a str>) -> &mut Self {
        self.i32(len_i32(values.len()));
        for value in values {
            self.str(value);
        }
        self
    }

    /// The ACL list of a create: every permission, for anyone or for the creator's
    /// credentials.
    pub fn acl(&mut self, acl: Acl) -> &mut Self {
        const ALL: i32 = 31;
        let (scheme, id) = match acl {
            Acl::Open => ("world", "anyone"),
            Acl::CreatorAll => ("auth", ""),
        };
        self.i32(1).i32(ALL).str(scheme).str(id)
    }

    /// The bytes, with the length in front.
    pub fn finish(mut self) -> Vec<u8> {
        let length = len_i32(self.0.len() - 4);
        self.0[..4].copy_from_slice(&length.to_be_bytes());
        self.0
    }
}

/// A length as jute writes it. Every frame this client writes is far below `i32::MAX`: a
/// node's data is bounded by the server's `jute.maxbuffer` long before.
fn len_i32(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

/// Who may touch a node this client creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acl {
    /// `OPEN_ACL_UNSAFE`: anyone, every permission.
    Open,
    /// `CREATOR_ALL_ACL`: every permission for the credentials the session authenticated
    /// with, no one else.
    CreatorAll,
}

/// What a node created by this client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateMode {
    /// Stays until deleted.
    Persistent,
    /// Deleted with its session; its name gets a sequence number appended.
    EphemeralSequential,
}

impl CreateMode {
    pub(super) fn flags(self) -> i32 {
        match self {
            CreateMode::Persistent => 0,
            CreateMode::EphemeralSequential => 3,
        }
    }
}

/// An answer the server sent that this client cannot read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a malformed answer from the server ({})", self.0)
    }
}

/// Reads the fields of one frame, checking every length against what is left.
pub(super) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(frame: &'a [u8]) -> Self {
        Reader { rest: frame }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Malformed> {
        if self.rest.len() < n {
            return Err(Malformed(what));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    pub fn i32(&mut self) -> Result<i32, Malformed> {
        let bytes = self.take(4, "a truncated integer")?;
        Ok(i32::from_be_bytes(
            bytes.try_into().map_err(|_| Malformed("an integer"))?,
        ))
    }

    pub fn i64(&mut self) -> Result<i64, Malformed> {
        let bytes = self.take(8, "a truncated long")?;
        Ok(i64::from_be_bytes(
            bytes.try_into().map_err(|_| Malformed("a long"))?,
        ))
    }

    /// A buffer; jute's null (length -1) reads as empty.
    pub fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(&[]);
        }
        let len = usize::try_from(len).map_err(|_| Malformed("a buffer's length"))?;
        self.take(len, "a buffer longer than its frame")
    }

    pub fn string(&mut self) -> Result<String, Malformed> {
        let bytes = self.bytes()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Malformed("a string that is not UTF-8"))
    }

    pub fn strings(&mut self) -> Result<Vec<String>, Malformed> {
        let count = self.i32()?;
        let count = usize::try_from(count.max(0)).map_err(|_| Malformed("a list's length"))?;
        // Each string takes at least its 4-byte length.
        if count > self.rest.len() / 4 {
            return Err(Malformed("a list longer than its frame"));
        }
        (0..count).map(|_| self.string()).collect()
    }

    pub fn stat(&mut self) -> Result<Stat, Malformed> {
        Ok(Stat {
            czxid: self.i64()?,
            mzxid: self.i64()?,
            ctime: self.i64()?,
            mtime: self.i64()?,
            version: self.i32()?,
            cversion: self.i32()?,
            aversion: self.i32()?,
            ephemeral_owner: self.i64()?,
            data_length: self.i32()?,
            num_children: self.i32()?,
            pzxid: self.i64()?,
        })
    }
}

/// A node's metadata, as the server keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// The id of the transaction that created the node.
    pub czxid: i64,
    /// The id of the transaction that last changed its data.
    pub mzxid: i64,
    /// When it was created, in ms since the Unix epoch (the server's clock).
    pub ctime: i64,
    /// When its data last changed, in ms since the Unix epoch (the server's clock).
    pub mtime: i64,
    /// How many times its data changed.
    pub version: i32,
    /// How many times its children changed.
    pub cversion: i32,
    /// How many times its ACL changed.
    pub aversion: i32,
    /// The session that owns it if it is ephemeral, else 0.
    pub ephemeral_owner: i64,
    /// The length of its data.
    pub data_length: i32,
    /// How many children it has.
    pub num_children: i32,
    /// The id of the transaction that last changed its children.
    pub pzxid: i64,
}

/// The header of every answer.
pub(super) struct ReplyHeader {
    pub xid: i32,
    pub zxid: i64,
    pub err: i32,
}

impl ReplyHeader {
    pub fn read(reader: &mut Reader<'_>) -> Result<ReplyHeader, Malformed> {
        Ok(ReplyHeader {
            xid: reader.i32()?,
            zxid: reader.i64()?,
            err: reader.i32()?,
        })
    }
}

/// The connect request: a new session (id 0) or an existing one, and the last transaction
/// this client saw (a server that is behind it refuses the connection).
pub(super) fn connect_request(
    last_zxid: i64,
    timeout_ms: i32,
    session_id: i64,
    password: &[u8],
) -> Vec<u8> {
    let mut frame = Frame::bare();
    frame
        .i32(0)
        .i64(last_zxid)
        .i32(timeout_ms)
        .i64(session_id)
        .bytes(password)
        .bool(false);
    frame.finish()
}

/// The server's answer to a connect request.
pub(super) struct ConnectResponse {
    /// The negotiated session timeout; 0 or less when the session expired.
    pub timeout_ms: i32,
    pub session_id: i64,
    pub password: Vec<u8>,
}

impl ConnectResponse {
    pub fn read(frame: &[u8]) -> Result<ConnectResponse, Malformed> {
        let mut reader = Reader::new(frame);
        let _protocol = reader.i32()?;
        let timeout_ms = reader.i32()?;
        let session_id = reader.i64()?;
        let password = reader.bytes()?.to_vec();
        Ok(ConnectResponse {
            timeout_ms,
            session_id,
            password,
        })
    }
}

/// What a watch event says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// The session's state changed (see [`WatchedEvent::session_state`]).
    Session,
    /// The watched node was created.
    NodeCreated,
    /// The watched node was deleted.
    NodeDeleted,
    /// The watched node's data changed.
    NodeDataChanged,
    /// The watched node's children changed.
    NodeChildrenChanged,
}

impl EventType {
    pub(super) fn from_code(code: i32) -> Option<EventType> {
        Some(match code {
            -1 => EventType::Session,
            1 => EventType::NodeCreated,
            2 => EventType::NodeDeleted,
            3 => EventType::NodeDataChanged,
            4 => EventType::NodeChildrenChanged,
            _ => return None,
        })
    }
}

/// Where a session stands, as this client knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// Connected to a server, which accepted the session.
    SyncConnected,
    /// Between servers: the session may still be alive.
    Disconnected,
    /// The server said the session expired (or was closed by another client).
    Expired,
    /// The server refused the credentials.
    AuthFailed,
    /// This client closed the session.
    Closed,
}

impl SessionState {
    /// Whether the session is over for good.
    pub fn is_terminated(self) -> bool {
        matches!(
            self,
            SessionState::Expired | SessionState::AuthFailed | SessionState::Closed
        )
    }
}

/// A one-shot watch's event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchedEvent {
    /// What happened.
    pub event_type: EventType,
    /// The session's state: [`SessionState::SyncConnected`] for events on nodes.
    pub session_state: SessionState,
}

/// A notification frame's body (after its header): its type, state and path.
pub(super) fn read_notification(reader: &mut Reader<'_>) -> Result<(i32, i32, String), Malformed> {
    let kind = reader.i32()?;
    let state = reader.i32()?;
    let path = reader.string()?;
    Ok((kind, state, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_carries_its_length_and_fields() {
        let mut frame = Frame::request(7, op::SYNC);
        frame.str("/a");
        let bytes = frame.finish();
        assert_eq!(
            bytes,
            [0, 0, 0, 14, 0, 0, 0, 7, 0, 0, 0, 9, 0, 0, 0, 2, b'/', b'a']
        );
    }

    #[test]
    fn lengths_longer_than_the_frame_are_errors() {
        // A buffer that claims 1 GiB.
        let mut reader = Reader::new(&[0x40, 0, 0, 0, 1, 2]);
        assert!(reader.bytes().is_err());
        // A list that claims a million strings in 8 bytes.
        let mut reader = Reader::new(&[0, 0x0f, 0x42, 0x40, 0, 0, 0, 0]);
        assert!(reader.strings().is_err());
        // A truncated stat.
        assert!(Reader::new(&[0; 67]).stat().is_err());
        assert!(Reader::new(&[0; 68]).stat().is_ok());
        // Not UTF-8.
        assert!(Reader::new(&[0, 0, 0, 1, 0xff]).string().is_err());
        // A null buffer reads as empty.
        assert_eq!(Reader::new(&[0xff; 4]).bytes(), Ok(&[][..]));
    }

    #[test]
    fn a_connect_response_reads_back() {
        let mut frame = Frame::bare();
        frame
            .i32(0)
            .i32(4000)
            .i64(0x1234)
            .bytes(&[9; 16])
            .bool(false);
        let bytes = frame.finish();
        let response = ConnectResponse::read(&bytes[4..]).expect("readable");
        assert_eq!(response.timeout_ms, 4000);
        assert_eq!(response.session_id, 0x1234);
        assert_eq!(response.password, [9; 16]);
    }
}
