//! `ipvsadm -Lnc` rows (ipvsadm.c `list_conn`).

use super::error::IpvsParseError;
use super::lexeme::{LineCtx, Tok, parse_addr_port, parse_expire};
use super::model::Connection;

/// True for the connection-table title (`pro expire state source virtual destination [pe name pe_data]`).
pub(crate) fn is_conn_title(toks: &[Tok<'_>]) -> bool {
    toks.first().is_some_and(|t| t.s == "pro") && toks.get(1).is_some_and(|t| t.s == "expire")
}

/// `conn-row = PROTO EXPIRE STATE CLIENT VIRTUAL DEST [ PE_NAME PE_DATA ]`.
pub(crate) fn conn_row<'a>(
    cx: &LineCtx<'a>,
    toks: &[Tok<'a>],
) -> Result<Connection<'a>, IpvsParseError> {
    let protocol = cx.tok(toks, 0, "a protocol")?.s;
    let expire_s = parse_expire(cx, cx.tok(toks, 1, "an expiry MM:SS")?)?;
    let state = cx.tok(toks, 2, "a connection state")?.s;
    let client = parse_addr_port(cx, cx.tok(toks, 3, "the client ADDR:PORT")?)?;
    let virtual_addr = parse_addr_port(cx, cx.tok(toks, 4, "the virtual ADDR:PORT")?)?;
    let dest = parse_addr_port(cx, cx.tok(toks, 5, "the destination ADDR:PORT")?)?;
    let pe = match (toks.get(6), toks.get(7)) {
        (None, _) => None,
        (Some(n), Some(d)) if toks.len() == 8 => Some((n.s, d.s)),
        (Some(n), _) => return Err(cx.err(*n, "end of line or `PE_NAME PE_DATA`")),
    };
    Ok(Connection {
        protocol,
        expire_s,
        state,
        client,
        virtual_addr,
        dest,
        pe,
        line: cx.no,
    })
}
