//! Layout of the hand-written verbs types against the system `verbs.h`.

use super::*;
use std::process::Command;

/// `(C expression, value in Rust)`: every size and offset the plugin relies on.
fn checks() -> Vec<(&'static str, usize)> {
    macro_rules! s {
        ($t:ident, $c:literal) => {
            (concat!("sizeof(", $c, ")"), size_of::<$t>())
        };
    }
    macro_rules! o {
        ($t:ident, $c:literal, $f:ident) => {
            (
                concat!("offsetof(", $c, ", ", stringify!($f), ")"),
                offset_of!($t, $f),
            )
        };
    }
    vec![
        s!(ibv_gid, "union ibv_gid"),
        s!(ibv_context_ops, "struct ibv_context_ops"),
        o!(ibv_context_ops, "struct ibv_context_ops", poll_cq),
        o!(ibv_context_ops, "struct ibv_context_ops", post_send),
        o!(ibv_context_ops, "struct ibv_context_ops", post_recv),
        o!(ibv_context, "struct ibv_context", ops),
        o!(ibv_context, "struct ibv_context", num_comp_vectors),
        s!(ibv_device_attr, "struct ibv_device_attr"),
        o!(ibv_device_attr, "struct ibv_device_attr", sys_image_guid),
        o!(ibv_device_attr, "struct ibv_device_attr", max_qp),
        o!(ibv_device_attr, "struct ibv_device_attr", max_qp_wr),
        o!(ibv_device_attr, "struct ibv_device_attr", max_cqe),
        o!(ibv_device_attr, "struct ibv_device_attr", phys_port_cnt),
        s!(ibv_port_attr, "struct ibv_port_attr"),
        o!(ibv_port_attr, "struct ibv_port_attr", flags),
        s!(ibv_async_event, "struct ibv_async_event"),
        o!(ibv_async_event, "struct ibv_async_event", event_type),
        s!(ibv_ece, "struct ibv_ece"),
        o!(ibv_ece, "struct ibv_ece", options),
        o!(ibv_port_attr, "struct ibv_port_attr", gid_tbl_len),
        o!(ibv_port_attr, "struct ibv_port_attr", lid),
        o!(ibv_port_attr, "struct ibv_port_attr", active_width),
        o!(ibv_port_attr, "struct ibv_port_attr", active_speed),
        o!(ibv_port_attr, "struct ibv_port_attr", link_layer),
        o!(ibv_port_attr, "struct ibv_port_attr", active_mtu),
        s!(ibv_pd, "struct ibv_pd"),
        s!(ibv_mr, "struct ibv_mr"),
        o!(ibv_mr, "struct ibv_mr", addr),
        o!(ibv_mr, "struct ibv_mr", length),
        o!(ibv_mr, "struct ibv_mr", lkey),
        o!(ibv_mr, "struct ibv_mr", rkey),
        o!(ibv_cq, "struct ibv_cq", context),
        o!(ibv_cq, "struct ibv_cq", cqe),
        o!(ibv_qp, "struct ibv_qp", context),
        o!(ibv_qp, "struct ibv_qp", qp_num),
        o!(ibv_qp, "struct ibv_qp", qp_type),
        s!(ibv_qp_cap, "struct ibv_qp_cap"),
        s!(ibv_qp_init_attr, "struct ibv_qp_init_attr"),
        o!(ibv_qp_init_attr, "struct ibv_qp_init_attr", cap),
        o!(ibv_qp_init_attr, "struct ibv_qp_init_attr", qp_type),
        o!(ibv_qp_init_attr, "struct ibv_qp_init_attr", sq_sig_all),
        s!(ibv_global_route, "struct ibv_global_route"),
        o!(ibv_global_route, "struct ibv_global_route", flow_label),
        o!(ibv_global_route, "struct ibv_global_route", sgid_index),
        o!(ibv_global_route, "struct ibv_global_route", traffic_class),
        s!(ibv_ah_attr, "struct ibv_ah_attr"),
        o!(ibv_ah_attr, "struct ibv_ah_attr", dlid),
        o!(ibv_ah_attr, "struct ibv_ah_attr", sl),
        o!(ibv_ah_attr, "struct ibv_ah_attr", is_global),
        o!(ibv_ah_attr, "struct ibv_ah_attr", port_num),
        s!(ibv_qp_attr, "struct ibv_qp_attr"),
        o!(ibv_qp_attr, "struct ibv_qp_attr", path_mtu),
        o!(ibv_qp_attr, "struct ibv_qp_attr", rq_psn),
        o!(ibv_qp_attr, "struct ibv_qp_attr", dest_qp_num),
        o!(ibv_qp_attr, "struct ibv_qp_attr", qp_access_flags),
        o!(ibv_qp_attr, "struct ibv_qp_attr", ah_attr),
        o!(ibv_qp_attr, "struct ibv_qp_attr", pkey_index),
        o!(ibv_qp_attr, "struct ibv_qp_attr", max_rd_atomic),
        o!(ibv_qp_attr, "struct ibv_qp_attr", max_dest_rd_atomic),
        o!(ibv_qp_attr, "struct ibv_qp_attr", min_rnr_timer),
        o!(ibv_qp_attr, "struct ibv_qp_attr", port_num),
        o!(ibv_qp_attr, "struct ibv_qp_attr", timeout),
        o!(ibv_qp_attr, "struct ibv_qp_attr", retry_cnt),
        o!(ibv_qp_attr, "struct ibv_qp_attr", rnr_retry),
        s!(ibv_sge, "struct ibv_sge"),
        s!(ibv_send_wr, "struct ibv_send_wr"),
        o!(ibv_send_wr, "struct ibv_send_wr", sg_list),
        o!(ibv_send_wr, "struct ibv_send_wr", num_sge),
        o!(ibv_send_wr, "struct ibv_send_wr", opcode),
        o!(ibv_send_wr, "struct ibv_send_wr", send_flags),
        o!(ibv_send_wr, "struct ibv_send_wr", imm_data),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            offset_of!(ibv_send_wr, rdma),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
            offset_of!(ibv_send_wr, rdma) + offset_of!(ibv_send_wr_rdma, rkey),
        ),
        o!(ibv_send_wr, "struct ibv_send_wr", qp_type),
        s!(ibv_recv_wr, "struct ibv_recv_wr"),
        o!(ibv_recv_wr, "struct ibv_recv_wr", num_sge),
        s!(ibv_wc, "struct ibv_wc"),
        o!(ibv_wc, "struct ibv_wc", status),
        o!(ibv_wc, "struct ibv_wc", opcode),
        o!(ibv_wc, "struct ibv_wc", vendor_err),
        o!(ibv_wc, "struct ibv_wc", byte_len),
        o!(ibv_wc, "struct ibv_wc", imm_data),
        o!(ibv_wc, "struct ibv_wc", qp_num),
        o!(ibv_wc, "struct ibv_wc", wc_flags),
        ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as usize),
        (
            "IBV_LINK_LAYER_INFINIBAND",
            IBV_LINK_LAYER_INFINIBAND as usize,
        ),
        ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as usize),
        ("IBV_QPT_RC", IBV_QPT_RC as usize),
        ("IBV_QPF_GRH_REQUIRED", IBV_QPF_GRH_REQUIRED as usize),
        ("IBV_EVENT_CQ_ERR", IBV_EVENT_CQ_ERR as usize),
        ("IBV_EVENT_QP_FATAL", IBV_EVENT_QP_FATAL as usize),
        ("IBV_EVENT_QP_REQ_ERR", IBV_EVENT_QP_REQ_ERR as usize),
        ("IBV_EVENT_QP_ACCESS_ERR", IBV_EVENT_QP_ACCESS_ERR as usize),
        ("IBV_EVENT_COMM_EST", IBV_EVENT_COMM_EST as usize),
        ("IBV_EVENT_PORT_ACTIVE", IBV_EVENT_PORT_ACTIVE as usize),
        ("IBV_EVENT_PORT_ERR", IBV_EVENT_PORT_ERR as usize),
        ("IBV_EVENT_DEVICE_FATAL", IBV_EVENT_DEVICE_FATAL as usize),
        ("IBV_FORK_DISABLED", IBV_FORK_DISABLED as usize),
        ("IBV_FORK_ENABLED", IBV_FORK_ENABLED as usize),
        ("IBV_FORK_UNNEEDED", IBV_FORK_UNNEEDED as usize),
        ("IBV_QPS_RTS", IBV_QPS_RTS as usize),
        ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as usize),
        (
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            IBV_QP_MAX_DEST_RD_ATOMIC as usize,
        ),
        (
            "IBV_ACCESS_RELAXED_ORDERING",
            IBV_ACCESS_RELAXED_ORDERING as usize,
        ),
        (
            "IBV_WR_RDMA_WRITE_WITH_IMM",
            IBV_WR_RDMA_WRITE_WITH_IMM as usize,
        ),
        ("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as usize),
        ("IBV_WC_RDMA_READ", IBV_WC_RDMA_READ as usize),
        (
            "IBV_WC_RECV_RDMA_WITH_IMM",
            IBV_WC_RECV_RDMA_WITH_IMM as usize,
        ),
        ("IBV_WC_WITH_IMM", IBV_WC_WITH_IMM as usize),
        ("IBV_WC_TM_RNDV_INCOMPLETE", 23),
        (
            "offsetof(struct ibv_context, abi_compat)",
            super::super::port::CONTEXT_ABI_COMPAT_OFFSET,
        ),
        (
            "offsetof(struct verbs_context, context) - offsetof(struct verbs_context, query_port)",
            super::super::port::VCTX_QUERY_PORT_BEFORE_CONTEXT,
        ),
        (
            "offsetof(struct verbs_context, context) - offsetof(struct verbs_context, sz)",
            super::super::port::VCTX_SZ_BEFORE_CONTEXT,
        ),
        (
            "sizeof(struct verbs_context) - offsetof(struct verbs_context, query_port)",
            super::super::port::VCTX_SPAN_FROM_QUERY_PORT,
        ),
        (
            // Where rdma-core >= 50 puts active_speed_ex: the next 4-aligned offset
            // after port_cap_flags2.
            "(offsetof(struct ibv_port_attr, port_cap_flags2) + 2 + 3) / 4 * 4",
            offset_of!(super::super::port::ibv_port_attr_ex, active_speed_ex),
        ),
        (
            "(size_t)__VERBS_ABI_IS_EXTENDED",
            super::super::port::ABI_IS_EXTENDED,
        ),
    ]
}

/// Compiles a C program against the installed `<infiniband/verbs.h>` that prints
/// each expression of [`checks`], and compares with the Rust values. Needs gcc and
/// libibverbs-dev (the project's Makefile installs both).
#[test]
fn layout_matches_system_verbs_h() {
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
    assert!(
        header.exists(),
        "{} is missing: install libibverbs-dev (apt-get install -y libibverbs-dev)",
        header.display()
    );
    let checks = checks();
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (expr, _) in &checks {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("cclkit-ib-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let out = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let text = String::from_utf8(run.stdout).unwrap();
    let values: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(values.len(), checks.len());
    let wrong: Vec<String> = checks
        .iter()
        .zip(&values)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((expr, rust), c)| format!("{expr}: C {c}, Rust {rust}"))
        .collect();
    assert!(wrong.is_empty(), "layout mismatches:\n{}", wrong.join("\n"));
}

#[test]
fn status_names_cover_verbs_h() {
    assert_eq!(wc_status_name(IBV_WC_SUCCESS), "SUCCESS");
    assert_eq!(wc_status_name(12), "RETRY_EXC_ERR");
    assert_eq!(wc_status_name(23), "TM_RNDV_INCOMPLETE");
    assert_eq!(wc_status_name(24), "UNKNOWN");
    assert_eq!(wc_status_name(u32::MAX), "UNKNOWN");
}
