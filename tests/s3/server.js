// codexec's test object store: s3rver (npm, pinned in package.json) on
// 127.0.0.1:PORT, with DIR as its disk, one bucket, and one key pair.
//
//   node --openssl-legacy-provider tests/s3/server.js PORT DIR BUCKET KEYFILE
//   (KEYFILE holds "ID SECRET"; s3rver's listing continuation tokens use DES)
//
// s3rver does not check SigV4 signatures: tests/s3/sigcheck.py, in front of
// it, does (with botocore). It also lacks ListMultipartUploads and
// AbortMultipartUpload, which codexec's fsck uses to find uploads a killed
// process left behind: the two are added below, over s3rver's own layout of
// uploads (a test addition, named as such; the rest is s3rver as published).
'use strict';

const fs = require('fs');
const path = require('path');
const S3rver = require('s3rver');
const AWSAccount = require('s3rver/lib/models/account');

const [port, dir, bucket, keyfile] = process.argv.slice(2);
const [keyId, secret] = keyfile ? fs.readFileSync(keyfile, 'utf8').trim().split(/\s+/) : [];
if (!port || !dir || !bucket || !keyId || !secret) {
  process.stderr.write('usage: server.js PORT DIR BUCKET KEYFILE\n');
  process.exit(2);
}
AWSAccount.DUMMY_ACCOUNT.revokeAccessKey('S3RVER');
AWSAccount.DUMMY_ACCOUNT.createKeyPair(keyId, secret);

const uploadsDir = path.join(dir, bucket, '._S3rver_uploads');

function xmlEscape(s) {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

// GET /BUCKET?uploads[&prefix=P] and DELETE /BUCKET/KEY?uploadId=ID
async function uploads(ctx, next) {
  const parts = ctx.path.split('/');
  if (parts[1] !== bucket) return next();
  if (ctx.method === 'GET' && parts.length <= 3 && !parts[2] && 'uploads' in ctx.query) {
    const prefix = ctx.query.prefix || '';
    let ids = [];
    try {
      ids = fs.readdirSync(uploadsDir);
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
    }
    let body = '<?xml version="1.0" encoding="UTF-8"?>\n<ListMultipartUploadsResult>' +
      `<Bucket>${xmlEscape(bucket)}</Bucket><IsTruncated>false</IsTruncated>`;
    for (const id of ids) {
      let key;
      let when;
      try {
        key = fs.readFileSync(path.join(uploadsDir, id, 'key'), 'utf8');
        when = fs.statSync(path.join(uploadsDir, id, 'key')).mtime;
      } catch (e) {
        continue;
      }
      if (!key.startsWith(prefix)) continue;
      body += `<Upload><Key>${xmlEscape(key)}</Key><UploadId>${xmlEscape(id)}</UploadId>` +
        `<Initiated>${when.toISOString()}</Initiated></Upload>`;
    }
    ctx.type = 'application/xml';
    ctx.body = body + '</ListMultipartUploadsResult>';
    return undefined;
  }
  if (ctx.method === 'DELETE' && parts.length > 2 && 'uploadId' in ctx.query) {
    const id = String(ctx.query.uploadId);
    const key = decodeURIComponent(parts.slice(2).join('/'));
    let stored = null;
    if (/^[A-Za-z0-9_-]+$/.test(id)) {
      try {
        stored = fs.readFileSync(path.join(uploadsDir, id, 'key'), 'utf8');
      } catch (e) {
        stored = null;
      }
    }
    if (stored !== key) {
      ctx.status = 404;
      ctx.type = 'application/xml';
      ctx.body = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchUpload</Code>' +
        '<Message>The specified upload does not exist.</Message></Error>';
      return undefined;
    }
    fs.rmSync(path.join(uploadsDir, id), { recursive: true, force: true });
    ctx.status = 204;
    return undefined;
  }
  return next();
}

const server = new S3rver({
  address: '127.0.0.1',
  port: Number(port),
  directory: dir,
  silent: true,
  configureBuckets: [{ name: bucket, configs: [] }],
});
server.middleware.unshift(uploads);
server.run().then(
  () => process.stdout.write(`s3rver on 127.0.0.1:${port}\n`),
  (err) => {
    process.stderr.write(`s3rver: ${err.message}\n`);
    process.exit(1);
  },
);
