-- Kernels a gateway runs that no session or pool row names: a process that
-- died between starting a kernel and recording it leaves one. The reconciler
-- notes when it first saw each and deletes it after a grace period.
CREATE TABLE unowned_kernels (
    gateway_url text NOT NULL,
    kernel_id   text NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (gateway_url, kernel_id)
);
