/* Version-dependent libfabric calls, kept in C so the Rust side binds one stable
 * signature whichever libfabric headers are installed. */
#include <string.h>
#include "wrapper.h"

int cclkit_ofi_has_dmabuf(void)
{
#ifdef FI_MR_DMABUF
	return 1;
#else
	return 0;
#endif
}

int cclkit_ofi_mr_reg_dmabuf(struct fid_domain *domain, int fd, uint64_t offset,
			     size_t len, void *base_addr, uint64_t access,
			     uint64_t requested_key, int iface, int device,
			     struct fid_mr **mr)
{
#ifdef FI_MR_DMABUF
	struct fi_mr_dmabuf dmabuf;
	struct fi_mr_attr attr;

	memset(&dmabuf, 0, sizeof(dmabuf));
	dmabuf.fd = fd;
	dmabuf.offset = offset;
	dmabuf.len = len;
	dmabuf.base_addr = base_addr;

	memset(&attr, 0, sizeof(attr));
	attr.dmabuf = &dmabuf;
	attr.iov_count = 1;
	attr.access = access;
	attr.requested_key = requested_key;
	attr.iface = (enum fi_hmem_iface)iface;
	if (attr.iface == FI_HMEM_CUDA)
		attr.device.cuda = device;
	return fi_mr_regattr(domain, &attr, FI_MR_DMABUF, mr);
#else
	(void)domain; (void)fd; (void)offset; (void)len; (void)base_addr;
	(void)access; (void)requested_key; (void)iface; (void)device;
	*mr = NULL;
	return -FI_ENOSYS;
#endif
}
