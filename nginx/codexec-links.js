// codexec: signed links checked by nginx itself (njs), so that a browser's
// download never waits for codexec-fcgi. See codexec-links.conf.
//
// A link (POST /v1/artifacts/{id}/links, the artifacts page) is
//   /v1/artifacts/<id>/content?version=<n>&u=<user>&k=<key id>&exp=<unix>&m=<meta>&sig=<mac>
// where sig is HMAC-SHA-256, keyed with the edge key codexec derives for
// links alone (its 64 hex characters, as codexec-admin nginx-link-key
// prints them), of
//   "codexec-link-v2\n" user "\n" id "\n" version "\n" exp "\n" key id "\n" m
// (the user percent-encoded as in u: RFC 3986 unreserved characters kept)
// and m, base64url, holds the version's storage key, MIME type, sha256 and
// Content-Disposition, one per line: all nginx needs to serve the file.
//
// This file only ever says yes. Whatever it does not accept (no link, a
// MAC that does not match, an expired link, anything malformed, a method
// other than GET and HEAD) goes to codexec unchanged, which answers as it
// always has: 403, 410, 401, 404. So does a link whose key is in the
// revocation list (codexec-links.conf checks it before this runs).
import crypto from 'crypto';

// Every step here is paid on each download: njs makes a fresh VM for each
// request, so nothing is cached and each call is counted (the revocation
// list is checked by nginx itself, in codexec-links.conf: a missing file
// would cost an exception here, about 300 µs).

// Compares two strings in time that depends on their length only.
function same(a, b) {
    if (a.length !== b.length) {
        return false;
    }
    let d = 0;
    for (let i = 0; i < a.length; i++) {
        d |= a.charCodeAt(i) ^ b.charCodeAt(i);
    }
    return d === 0;
}

// If-None-Match against the sha256, as codexec compares (weak allowed).
function etagMatches(inm, sha) {
    if (typeof inm !== 'string') {
        return false;
    }
    const tags = inm.split(',');
    for (let i = 0; i < tags.length; i++) {
        let t = tags[i].trim();
        if (t === '*') {
            return true;
        }
        if (t.startsWith('W/')) {
            t = t.slice(2);
        }
        if (t === '"' + sha + '"') {
            return true;
        }
    }
    return false;
}

// A storage key as codexec derives it: relative, no empty, "." or ".."
// step (it is under the MAC: this is a second line, not the first).
function keySafe(key) {
    const k = '/' + key + '/';
    return key.length > 0 && k.indexOf('//') < 0 && k.indexOf('/./') < 0 &&
        k.indexOf('/../') < 0 && !/[\x00-\x1f\x7f?#%\\]/.test(key);
}

function download(r) {
    // nginx's $arg_* (the first of each name, not decoded: the MAC covers
    // u as the link encodes it) cost a third of njs's own r.args
    const v = r.variables;
    const sig = v.arg_sig, u = v.arg_u, k = v.arg_k, ver = v.arg_version, exp = v.arg_exp;
    const m = v.arg_m, key = v.codexec_link_key;

    if (!sig || u === undefined || k === undefined || !ver || !exp || !m ||
        typeof key !== 'string' || key.length !== 64 ||
        (r.method !== 'GET' && r.method !== 'HEAD')) {
        return r.internalRedirect('@codexec');
    }
    const id = r.uri.split('/')[3];
    const want = crypto.createHmac('sha256', key)
        .update('codexec-link-v2\n' + u + '\n' + id + '\n' + ver + '\n' + exp + '\n' + k + '\n' + m)
        .digest('base64url');
    if (!same(want, sig) || !(+exp >= Date.now() / 1000)) {
        return r.internalRedirect('@codexec');
    }
    const meta = Buffer.from(m, 'base64url').toString().split('\n');
    if (meta.length !== 4 || !keySafe(meta[0]) || meta[2].length !== 64) {
        return r.internalRedirect('@codexec');
    }
    const etag = '"' + meta[2] + '"';
    // (codexec's answer, should the file be gone, sets its own type)
    r.headersOut['Content-Type'] = meta[1];
    if (etagMatches(r.headersIn['If-None-Match'], meta[2])) {
        const h = r.headersOut;
        h['ETag'] = etag;
        h['Content-Disposition'] = meta[3];
        h['Cache-Control'] = 'private';
        return r.return(304);
    }
    // the rest only on the file's own answer (codexec-edge.conf)
    v.codexec_edge_path = meta[0];
    v.codexec_edge_etag = etag;
    v.codexec_edge_disposition = meta[3];
    // (the query goes along: if the file is gone, codexec gets the link)
    r.internalRedirect('/_codexec_edge?' + v.args);
}

export default {download};
