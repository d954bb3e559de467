lk_add_script_test(NAME resume_exact SCRIPT resume/test_resume.sh LABELS multiproc fault TIMEOUT 300)
