/* Compile-time check of the committed header against NCCL_ABI.md: every size and the
 * offsets that moved between versions. Independent of the Rust asserts on purpose. */
#include <stddef.h>
#include "cclkit_abi.h"

#define SIZE(t, n) _Static_assert(sizeof(t) == (n), #t " size")
#define OFF(t, f, n) _Static_assert(offsetof(t, f) == (n), #t "." #f " offset")

SIZE(ncclResult_t, 4);
SIZE(ncclNetDeviceHandle_v7_t, 32);
OFF(ncclNetDeviceHandle_v7_t, needsProxyProgress, 24);
SIZE(ncclNetVDeviceProps_v9_t, 20);
SIZE(ncclNetVDeviceProps_v12_t, 36);
SIZE(ncclNetCommConfig_v10_t, 4);
SIZE(ncclNetCommAttr_v11_t, 16);
SIZE(ncclNetAttr_v11_t, 44);
OFF(ncclNetAttr_v11_t, op, 32);
OFF(ncclNetAttr_v11_t, proto, 40);
SIZE(ncclNetSGE_v8_t, 24);
SIZE(ncclNetSGE_v9_t, 24);

SIZE(ncclNetProperties_v6_t, 48);
OFF(ncclNetProperties_v6_t, ptrSupport, 24);
OFF(ncclNetProperties_v6_t, speed, 28);
OFF(ncclNetProperties_v6_t, maxRecvs, 44);
SIZE(ncclNetProperties_v7_t, 56);
OFF(ncclNetProperties_v7_t, netDeviceType, 48);
OFF(ncclNetProperties_v7_t, netDeviceVersion, 52);
SIZE(ncclNetProperties_v8_t, 64);
OFF(ncclNetProperties_v8_t, regIsGlobal, 28);
OFF(ncclNetProperties_v8_t, speed, 32);
OFF(ncclNetProperties_v8_t, netDeviceVersion, 56);
SIZE(ncclNetProperties_v9_t, 104);
OFF(ncclNetProperties_v9_t, forceFlush, 32);
OFF(ncclNetProperties_v9_t, vProps, 64);
OFF(ncclNetProperties_v9_t, maxP2pBytes, 88);
OFF(ncclNetProperties_v9_t, maxCollBytes, 96);
SIZE(ncclNetProperties_v11_t, 112);
OFF(ncclNetProperties_v11_t, maxMultiRequestSize, 104);
SIZE(ncclNetProperties_v12_t, 128);
OFF(ncclNetProperties_v12_t, vProps, 64);
OFF(ncclNetProperties_v12_t, maxP2pBytes, 104);
OFF(ncclNetProperties_v12_t, maxCollBytes, 112);
OFF(ncclNetProperties_v12_t, maxMultiRequestSize, 120);
OFF(ncclNetProperties_v12_t, railId, 124);
OFF(ncclNetProperties_v12_t, planeId, 126);

SIZE(ncclNet_v6_t, 136);
OFF(ncclNet_v6_t, regMrDmaBuf, 64);
OFF(ncclNet_v6_t, closeListen, 128);
SIZE(ncclNet_v7_t, 152);
OFF(ncclNet_v7_t, irecvConsumed, 144);
SIZE(ncclNet_v8_t, 152);
SIZE(ncclNet_v9_t, 160);
OFF(ncclNet_v9_t, makeVDevice, 152);
SIZE(ncclNet_v10_t, 160);
SIZE(ncclNet_v11_t, 176);
OFF(ncclNet_v11_t, finalize, 160);
OFF(ncclNet_v11_t, setNetAttr, 168);
SIZE(ncclNet_v12_t, 176);
OFF(ncclNet_v12_t, init, 8);
OFF(ncclNet_v12_t, isend, 80);
OFF(ncclNet_v12_t, test, 104);
OFF(ncclNet_v12_t, finalize, 160);
OFF(ncclNet_v12_t, setNetAttr, 168);

SIZE(ncclCollNet_v6_t, 120);
SIZE(ncclCollNet_v7_t, 120);
SIZE(ncclCollNet_v8_t, 136);
SIZE(ncclCollNet_v9_t, 144);
SIZE(ncclCollNet_v10_t, 144);
SIZE(ncclCollNet_v11_t, 152);
SIZE(ncclCollNet_v12_t, 152);
OFF(ncclCollNet_v12_t, iallreduce, 80);
OFF(ncclCollNet_v12_t, makeVDevice, 136);
OFF(ncclCollNet_v12_t, finalize, 144);

SIZE(ncclNvlDomainInfo_v5_t, 12);
SIZE(ncclTunerConstants_v5_t, 1152);
OFF(ncclTunerConstants_v5_t, hwLatencies, 168);
OFF(ncclTunerConstants_v5_t, llMaxBws, 672);
OFF(ncclTunerConstants_v5_t, perChMaxRingLL128Bws, 768);
OFF(ncclTunerConstants_v5_t, perChMaxTreeLL128Bws, 864);
OFF(ncclTunerConstants_v5_t, perChMaxTreeBws, 960);
OFF(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws, 1056);
SIZE(ncclTunerConstants_v7_t, 1272);
OFF(ncclTunerConstants_v7_t, hwLatencies, 168);
OFF(ncclTunerConstants_v7_t, llMaxBws, 672);
OFF(ncclTunerConstants_v7_t, perChMaxRingLL128Bws, 792);
OFF(ncclTunerConstants_v7_t, perChMaxTreeLL128Bws, 912);
OFF(ncclTunerConstants_v7_t, perChMaxTreeBws, 1032);
OFF(ncclTunerConstants_v7_t, perChMaxNVLSTreeBws, 1152);
SIZE(ncclTuner_v7_t, 40);
OFF(ncclTuner_v7_t, getChunkSize, 32);
SIZE(ncclTuner_v1_t, 32);
SIZE(ncclTuner_v2_t, 32);
SIZE(ncclTuner_v3_t, 32);
SIZE(ncclTuner_v4_t, 32);
SIZE(ncclTuner_v5_t, 32);
SIZE(ncclTuner_v6_t, 40);
OFF(ncclTuner_v6_t, getChunkSize, 32);
SIZE(ncclEnv_v1_t, 32);
OFF(ncclEnv_v1_t, init, 8);
OFF(ncclEnv_v1_t, finalize, 16);
OFF(ncclEnv_v1_t, getEnv, 24);
SIZE(ncclEnv_v2_t, 32);
OFF(ncclEnv_v2_t, init, 8);
OFF(ncclEnv_v2_t, finalize, 16);
OFF(ncclEnv_v2_t, getEnv, 24);

/* Profiler v1-v7 (numbers from offsetof probes of NCCL's profiler_vN.h; `u` is C's anonymous union). */
SIZE(ncclProfilerEventDescr_v1_t, 120);
OFF(ncclProfilerEventDescr_v1_t, u.coll.datatype, 84);
OFF(ncclProfilerEventDescr_v1_t, u.coll.isNvls, 112);
OFF(ncclProfilerEventDescr_v1_t, u.p2p.peer, 72);
SIZE(ncclProfilerEventDescr_v2_t, 128);
OFF(ncclProfilerEventDescr_v2_t, u.coll.trafficBytes, 96);
OFF(ncclProfilerEventDescr_v2_t, u.coll.proto, 120);
SIZE(ncclProfilerEventDescr_v3_t, 120);
OFF(ncclProfilerEventDescr_v3_t, u.coll.nMaxChannels, 96);
OFF(ncclProfilerEventDescr_v3_t, u.netPlugin.data, 32);
SIZE(ncclProfilerEventDescr_v4_t, 104);
OFF(ncclProfilerEventDescr_v4_t, u.coll.proto, 96);
OFF(ncclProfilerEventDescr_v4_t, u.p2p.nChannels, 60);
OFF(ncclProfilerEventDescr_v4_t, u.kernelCh.pTimer, 32);
OFF(ncclProfilerEventDescr_v4_t, u.proxyOp.isSend, 44);
SIZE(ncclProfilerEventDescr_v5_t, 112);
OFF(ncclProfilerEventDescr_v5_t, u.collApi.graphCaptured, 64);
OFF(ncclProfilerEventDescr_v5_t, u.coll.parentGroup, 104);
OFF(ncclProfilerEventDescr_v5_t, u.p2p.parentGroup, 64);
SIZE(ncclProfilerEventDescr_v6_t, 112);
OFF(ncclProfilerEventDescr_v6_t, u.ceColl.stream, 104);
OFF(ncclProfilerEventDescr_v6_t, u.ceCollBatch.useIntraSync, 40);
SIZE(ncclProfilerEventDescr_v7_t, 136);
OFF(ncclProfilerEventDescr_v7_t, u.collApi.userTag, 72);
OFF(ncclProfilerEventDescr_v7_t, u.p2pApi.userTag, 64);
OFF(ncclProfilerEventDescr_v7_t, u.coll.kernelVariant, 112);
OFF(ncclProfilerEventDescr_v7_t, u.coll.isSymColl, 120);
OFF(ncclProfilerEventDescr_v7_t, u.coll.userTag, 128);
OFF(ncclProfilerEventDescr_v7_t, u.p2p.userTag, 72);
OFF(ncclProfilerEventDescr_v7_t, u.ceColl.userTag, 112);
OFF(ncclProfilerEventDescr_v7_t, u.kernelPhase.pTimer, 40);
SIZE(ncclProfilerEventStateArgs_v1_t, 16);
SIZE(ncclProfilerEventStateArgs_v4_t, 8);
SIZE(ncclProfilerNetIbDescr_v1_t, 40);
OFF(ncclProfilerNetIbDescr_v1_t, qp.length, 32);
SIZE(ncclProfilerNetSockDescr_v1_t, 24);
OFF(ncclProfilerNetSockDescr_v1_t, sock.length, 16);
SIZE(ncclProfiler_v1_t, 48);
SIZE(ncclProfiler_v4_t, 48);
SIZE(ncclProfiler_v7_t, 48);
OFF(ncclProfiler_v7_t, recordEventState, 32);
OFF(ncclProfiler_v7_t, finalize, 40);

int main(void) { return 0; }
