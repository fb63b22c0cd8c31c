/* The libfabric headers cclkit-net-ofi binds (bindgen input; must be a real file
 * so the generated static-fns C file can include it). */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

/* Hand-written helpers (shim.c): calls whose shape depends on the libfabric
 * version installed, so Rust never sees the version-specific structs. */

/* Registers a dma-buf region; -FI_ENOSYS when built against libfabric < 1.20
 * (no FI_MR_DMABUF). `iface`/`device` as in fi_mr_attr. */
int cclkit_ofi_mr_reg_dmabuf(struct fid_domain *domain, int fd, uint64_t offset,
                             size_t len, void *base_addr, uint64_t access,
                             uint64_t requested_key, int iface, int device,
                             struct fid_mr **mr);

/* 1 when the headers this was built against define FI_MR_DMABUF. */
int cclkit_ofi_has_dmabuf(void);
