/* C ABI of libtierfs_gpu.so (crate gpu-side, src/ffi.rs has the details).
 *
 * Protocol: open (resolve + plan) -> read the plan JSON -> allocate the arena (4096-aligned,
 * plan.arena_bytes long; device memory of GPU `device`, or host memory with device = -1) ->
 * load -> close. Every tensor of the plan lives at arena + offset, aligned for its dtype.
 * Functions returning int give 0 on success and -1 on failure, with a message in the buffer.
 * No function panics or aborts; none keeps a pointer given to it after returning.
 */
#ifndef TIERFS_GPU_H
#define TIERFS_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tierfs_gpu_handle tierfs_gpu_handle;

/* Resolves `path` (a file on a tierfs mount is replaced by its source file), parses the
 * safetensors header and plans the selection: NULL or "all", {"tensors": [names]} or
 * {"blocks": [names]}. chunk_bytes: read size, 0 for the default (8 MiB). NULL on error. */
tierfs_gpu_handle *tierfs_gpu_open(const char *path, const char *selection_json,
                                   uint64_t chunk_bytes, char *err, size_t err_len);

/* {"requested", "source", "arena_bytes", "tensor_bytes", "metadata",
 *  "tensors": [{"name", "dtype", "shape", "offset", "len"}]}; owned by the handle. */
const char *tierfs_gpu_plan(const tierfs_gpu_handle *handle);

/* 0 if GPU `device` is usable, else -1 and one sentence saying why not (no driver, no GPU). */
int tierfs_gpu_check_device(int device, char *err, size_t err_len);

/* Fills dst (dst_len bytes, 4096-aligned). device: GPU ordinal, or -1 for host memory.
 * gds: "auto" (NULL), "on", "off" or "compat". threads: 0 for the default (8).
 * wait_stream: a cudaStream_t of the caller to synchronize before writing, or 0.
 * out: the report as JSON ({"route", "gb_per_s", "fallback", ...}) or the error message. */
int tierfs_gpu_load(tierfs_gpu_handle *handle, void *dst, uint64_t dst_len, int device,
                    const char *gds, uint32_t threads, uint64_t wait_stream, char *out,
                    size_t out_len);

void tierfs_gpu_close(tierfs_gpu_handle *handle);

#ifdef __cplusplus
}
#endif

#endif /* TIERFS_GPU_H */
