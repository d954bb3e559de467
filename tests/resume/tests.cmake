lk_add_script_test(NAME resume_exact SCRIPT resume/test_resume.sh LABELS multiproc fault TIMEOUT 300)
lk_add_script_test(NAME export_torch SCRIPT resume/test_export_torch.sh LABELS unit parity TIMEOUT 120)
lk_add_script_test(NAME resume_xprec SCRIPT resume/test_xprec.sh LABELS multiproc TIMEOUT 300)
lk_add_script_test(NAME resume_ckpt_tamper SCRIPT resume/test_ckpt_tamper.sh LABELS fault TIMEOUT 300)
