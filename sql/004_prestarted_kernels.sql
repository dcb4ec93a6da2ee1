-- Kernels started ahead of demand (kernel_pool_size). A row is a kernel that
-- nobody has used: claiming one deletes its row in the claiming transaction,
-- and the session takes the row's id, so its workspace is 'w-' || id, the
-- directory the kernel was started in. Kernels never come back here.
CREATE TABLE prestarted_kernels (
    id          uuid PRIMARY KEY,
    gateway_url text NOT NULL,
    kernel_name text NOT NULL,
    kernel_id   text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX prestarted_kernels_gateway ON prestarted_kernels (gateway_url, kernel_name, created_at);
