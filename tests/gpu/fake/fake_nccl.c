/* NCCL for the fake GPU: every call that would start communication fails
 * with ncclSystemError, so that a fake-GPU program links without the real
 * NCCL (which would drive a real GPU) and `nccl` on the fake GPU is a clear
 * error. NCCL itself is not modelled: its use is checked by gpu_nccl on a
 * GPU and by nccl_bootstrap's fake transport. Test-only. */
#include <nccl.h>

#define REFUSED "the fake GPU has no NCCL (tests/gpu/fake/)"

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { return (void)id, ncclSystemError; }
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    (void)nranks, (void)id, (void)rank, (void)config;
    *comm = NULL;
    return ncclSystemError;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) { return (void)comm, ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return (void)comm, ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return (void)comm, ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *e) { return (void)comm, *e = ncclSystemError, ncclSuccess; }
const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "system error: " REFUSED; }
const char *ncclGetLastError(ncclComm_t comm) { return (void)comm, REFUSED; }
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)op, (void)c, (void)st;
    return ncclSystemError;
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)op, (void)c, (void)st;
    return ncclSystemError;
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)c, (void)st;
    return ncclSystemError;
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
    (void)s, (void)r, (void)n, (void)t, (void)root, (void)c, (void)st;
    return ncclSystemError;
}
