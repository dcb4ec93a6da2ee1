// codexec: signed links checked by nginx itself (njs), so that a browser's
// download never waits for codexec-fcgi. See codexec-links.conf.
//
// A link (POST /v1/artifacts/{id}/links, the artifacts page) is
//   /v1/artifacts/<id>/content?version=<n>&u=<user>&k=<key id>&exp=<unix>&m=<meta>&sig=<mac>
// where sig is HMAC-SHA-256, keyed with the edge key codexec derives for
// links alone (codexec-admin nginx-link-key), of
//   "codexec-link-v2\n" user "\n" id "\n" version "\n" exp "\n" key id "\n" m
// and m, base64url, holds the version's storage key, MIME type, sha256 and
// Content-Disposition, one per line: all nginx needs to serve the file.
//
// This file only ever says yes. Whatever it does not accept (no link, a
// MAC that does not match, an expired link, a key in the revocation list,
// anything malformed, a method other than GET and HEAD) goes to codexec
// unchanged, which answers as it always has: 403, 410, 401, 404.
import crypto from 'crypto';
import fs from 'fs';

const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
const HEX64 = /^[0-9a-f]{64}$/;

// The one value of a query parameter, or null (absent or repeated).
function param(r, name) {
    const v = r.args[name];
    return typeof v === 'string' ? v : null;
}

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
// step, nothing nginx would read as anything but a path.
function keySafe(key) {
    if (key.length === 0 || key.length > 1024 || /[\x00-\x1f\x7f?#%\\]/.test(key)) {
        return false;
    }
    const steps = key.split('/');
    for (let i = 0; i < steps.length; i++) {
        if (steps[i] === '' || steps[i] === '.' || steps[i] === '..') {
            return false;
        }
    }
    return true;
}

function toCodexec(r) {
    r.internalRedirect('@codexec');
}

function revoked(r, k) {
    if (k === '') {
        return false; // made under web-server authentication: no key to revoke
    }
    try {
        fs.accessSync(r.variables.codexec_revoked_dir + '/' + k);
        return true;
    } catch (e) {
        return e.code !== 'ENOENT'; // can't tell: codexec decides
    }
}

function download(r) {
    const id = (r.uri.match(/^\/v1\/artifacts\/([^/]+)\/content$/) || [])[1];
    const sig = param(r, 'sig'), u = param(r, 'u'), k = param(r, 'k'), ver = param(r, 'version');
    const exp = param(r, 'exp'), m = param(r, 'm');
    const keyHex = r.variables.codexec_link_key;

    if ((r.method !== 'GET' && r.method !== 'HEAD') || !id || !UUID.test(id) || sig === null ||
        u === null || k === null || ver === null || exp === null || !m ||
        !/^[1-9][0-9]{0,8}$/.test(ver) || !/^[1-9][0-9]{0,15}$/.test(exp) ||
        (k !== '' && !UUID.test(k)) || typeof keyHex !== 'string' || !HEX64.test(keyHex)) {
        return toCodexec(r);
    }
    const msg = ['codexec-link-v2', u, id, ver, exp, k, m].join('\n');
    const want = crypto.createHmac('sha256', Buffer.from(keyHex, 'hex')).update(msg)
        .digest('base64url');
    if (!same(want, sig) || Number(exp) < Date.now() / 1000 || revoked(r, k)) {
        return toCodexec(r);
    }
    const meta = Buffer.from(m, 'base64url').toString().split('\n');
    if (meta.length !== 4 || !keySafe(meta[0]) || !HEX64.test(meta[2]) ||
        /[\r\n]/.test(meta[1] + meta[3])) {
        return toCodexec(r);
    }
    r.headersOut['Content-Type'] = meta[1];
    r.headersOut['ETag'] = '"' + meta[2] + '"';
    r.headersOut['Content-Disposition'] = meta[3];
    r.headersOut['Cache-Control'] = 'private';
    if (etagMatches(r.headersIn['If-None-Match'], meta[2])) {
        return r.return(304);
    }
    r.variables.codexec_edge_path = meta[0];
    // (the query goes along: if the file is gone, codexec gets the link)
    r.internalRedirect('/_codexec_edge?' + r.variables.args);
}

export default {download};
